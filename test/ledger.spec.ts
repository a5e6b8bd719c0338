import { execFileSync } from 'node:child_process';
import { DataSource } from 'typeorm';
import { TransactionService } from '../src/database/transaction.service.js';
import { IssueService } from '../src/ledger/issue.service.js';
import { UserCoupon } from '../src/ledger/user-coupon.entity.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { countTowardsLimit, findUserCoupon, setStatus } from '../src/ledger/user-coupons.js';
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

  it.each([true, false])(
    'issueMany answers the rows exactly as stored, each with its own id (INSERT ... RETURNING: %s)',
    async (returning) => {
      const issuer = t.app.get(IssueService);
      expect(issuer.insertReturning).toBe(true); // MariaDB here; MySQL 8 reads the ids back
      const targets = [3, 1, 2].map((i) => ({ userId: `many-${seq}-${i}`, key: `bulk:many-${seq}` }));
      seq++;
      issuer.insertReturning = returning;
      try {
        const issued = await tx.inTransaction((em) =>
          t.app
            .get(IssueService)
            .issueMany(em, couponRef(), targets, { source: 'BULK', fromStock: true, reason: 'segment', txId: () => 'bulk:many' }),
        );
        expect(issued.map((uc) => uc.userId)).toEqual(targets.map((x) => x.userId));
        expect(new Set(issued.map((uc) => uc.id)).size).toBe(3);
        const manager = t.app.get(DataSource).manager;
        for (const uc of issued) expect(uc).toEqual(await manager.findOneByOrFail(UserCoupon, { id: uc.id }));
      } finally {
        issuer.insertReturning = true;
      }
    },
  );

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

  it('countTowardsLimit counts grabs and bulk issues per listed user with one index lookup each, however many hold the coupon', async () => {
    const many = await createCoupon(t.url, { totalStock: 1, perUserLimit: 2 });
    const ref = { ...couponRef(), id: many.id };
    const holders = Array.from({ length: 20_000 }, (_, i) => `holder-${i}`);
    for (let i = 0; i < holders.length; i += 5000) {
      const chunk = holders.slice(i, i + 5000).map((userId) => ({ userId, key: 'bulk:count-test' }));
      await tx.inTransaction((em) =>
        t.app
          .get(IssueService)
          .issueMany(em, ref, chunk, { source: 'BULK', fromStock: false, reason: 'test', txId: () => 'bulk:count-test' }),
      );
    }
    // A second coupon of the first holder, by grab, and a reissue, which does not count.
    await tx.inTransaction((em) =>
      t.app.get(IssueService).issueMany(em, ref, [{ userId: 'holder-0', key: 'g-1' }], {
        source: 'GRAB',
        fromStock: true,
        reason: 'GRAB',
        txId: () => 'grab:g-1',
      }),
    );
    await tx.inTransaction((em) =>
      t.app.get(IssueService).issue(em, { coupon: ref, userId: 'holder-1', source: 'REISSUE', fromStock: false, txId: 'test:reissue' }),
    );
    await t.db.query('ANALYZE TABLE user_coupon');
    const listed = [...holders.slice(0, 500), 'holder-0', 'HOLDER-2', ...Array.from({ length: 499 }, (_, i) => `nobody-${i}`)];
    const qr = t.db.createQueryRunner();
    try {
      const reads = async () =>
        ((await qr.query(`SHOW SESSION STATUS LIKE 'Handler_read%'`)) as { Value: string }[]).reduce((n, r) => n + Number(r.Value), 0);
      const before = await reads();
      const held = await countTowardsLimit(qr.manager, many.id, listed);
      const examined = (await reads()) - before;
      expect(held.size).toBe(500);
      expect(held.get('holder-0')).toBe(2);
      expect(held.get('holder-1')).toBe(1);
      expect(held.get('HOLDER-2')).toBeUndefined();
      expect(held.get('nobody-0')).toBeUndefined();
      // About two handler reads per listed user, plus the SHOW itself; reading the coupon's holders would be over 20,000.
      expect(examined).toBeLessThan(5000);
    } finally {
      await qr.release();
    }
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
