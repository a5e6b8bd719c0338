import { execFileSync } from 'node:child_process';
import { DataSource } from 'typeorm';
import { TransactionService } from '../src/database/transaction.service.js';
import { IssueService } from '../src/ledger/issue.service.js';
import { UserCoupon } from '../src/ledger/user-coupon.entity.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { findUserCoupon, setStatus } from '../src/ledger/user-coupons.js';
import { createCoupon, CouponView, grabUserCoupon, redeemUserCoupon } from './support/factories.js';
import { startTestApp, TestApp } from './support/harness.js';

describe('ledger repository functions', () => {
  let t: TestApp;
  let tx: TransactionService;
  let coupon: CouponView;
  let seq = 0;

  beforeAll(async () => {
    t = await startTestApp();
    tx = t.app.get(TransactionService);
    coupon = await createCoupon(t.url, { totalStock: 100 });
  });
  afterAll(() => t.close());

  const couponRef = () => ({
    id: coupon.id,
    validityType: 'RELATIVE' as const,
    validityDays: 7,
    validityStartAt: null,
    validityEndAt: null,
  });
  const issue = (extra: { replacesUserCouponId?: string; idempotencyKey?: string } = {}) =>
    tx.inTransaction((em) =>
      t.app.get(IssueService).issue(em, {
        coupon: couponRef(),
        userId: `ledger-user-${++seq}`,
        source: 'REISSUE',
        fromStock: seq % 2 === 0,
        reason: `reason ${seq}`,
        txId: `test:${seq}`,
        ...extra,
      }),
    );

  it('writes and reads every column the entity declares, as TypeORM reads them', async () => {
    const first = await issue();
    const key = `reissue:k-${seq}`;
    const uc = await issue({ replacesUserCouponId: first.id, idempotencyKey: key });
    const manager = t.app.get(DataSource).manager;
    const byTypeorm = await manager.findOneByOrFail(UserCoupon, { id: uc.id });
    const byLedger = await findUserCoupon(manager, uc.id);
    expect(byLedger).toEqual(byTypeorm);
    expect(byLedger).toMatchObject({ replacesUserCouponId: first.id, idempotencyKey: key, fromStock: uc.fromStock, reason: uc.reason });
  });

  it('setStatus always moves updated_at and keeps used_at set exactly while USED', async () => {
    const { id, updatedAt } = await issue();
    const used = new Date(updatedAt.getTime() + 1000);
    const back = new Date(updatedAt.getTime() + 2000);
    await tx.inTransaction((em) => setStatus(em, [id], 'UNUSED', 'USED', used));
    expect(await findUserCoupon(t.db.manager, id)).toMatchObject({ status: 'USED', usedAt: used, updatedAt: used });
    await tx.inTransaction((em) => setStatus(em, [id], 'USED', 'UNUSED', back));
    expect(await findUserCoupon(t.db.manager, id)).toMatchObject({ status: 'UNUSED', usedAt: null, updatedAt: back });
    expect(await tx.inTransaction((em) => setStatus(em, [id], 'USED', 'VOID', back))).toBe(0);
  });

  it('is the only folder with statements that write user_coupon, its state log or coupon_stock', () => {
    const pattern = String.raw`(INSERT INTO|UPDATE|DELETE FROM) +(user_coupon|user_coupon_state_log|coupon_stock)\b`;
    const writers = execFileSync('git', ['grep', '-lE', pattern, '--', 'src'], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .filter((f) => !f.startsWith('src/database/migrations/'));
    expect(writers.length).toBeGreaterThan(0);
    expect(writers.filter((f) => !f.startsWith('src/ledger/'))).toEqual([]);
  });

  it('checkInvariants with a scope reports only the damage to those coupons; without one, all of it', async () => {
    const [damaged, sound] = await Promise.all([createCoupon(t.url, { totalStock: 5 }), createCoupon(t.url, { totalStock: 5 })]);
    const used = await grabUserCoupon(t.url, damaged.id, 'scope-user');
    await redeemUserCoupon(t.url, used.id, 'scope-user');
    await grabUserCoupon(t.url, sound.id, 'scope-user');
    const runner = t.db.createQueryRunner();
    await runner.startTransaction();
    try {
      await runner.query(`UPDATE coupon_stock SET stock = stock - 1 WHERE coupon_id = ?`, [damaged.id]);
      await runner.query(`UPDATE user_coupon SET used_at = NULL WHERE id = ?`, [used.id]);
      expect(await checkInvariants(runner.manager, { couponIds: [sound.id] })).toEqual([]);
      const labels = (v: string[]) => v.map((line) => line.slice(0, line.indexOf(':')));
      expect(labels(await checkInvariants(runner.manager, { couponIds: [damaged.id, sound.id] }))).toEqual(['stock', 'used_at']);
      expect(labels(await checkInvariants(runner.manager))).toEqual(['stock', 'used_at']);
      expect(await checkInvariants(runner.manager, { couponIds: [] })).toEqual([]);
    } finally {
      await runner.rollbackTransaction();
      await runner.release();
    }
  });
});
