import { SchedulerRegistry } from '@nestjs/schedule';
import request from 'supertest';
import { AppError } from '../src/common/errors.js';
import { TransactionService } from '../src/database/transaction.service.js';
import { StockService } from '../src/ledger/stock.service.js';
import { EXPIRE_JOB } from '../src/state-machine/expire.cron.job.js';
import { tryAcquireLease } from '../src/database/lease.js';
import { EXPIRY_LEASE, ExpiryService } from '../src/state-machine/expiry.service.js';
import { StateMachineService } from '../src/ledger/state-machine.service.js';
import { createCoupon } from './support/factories.js';
import { startTestApp, TestApp } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';

const MINUTE = 60_000;

/**
 * Seeds `n` GRAB coupons of a fresh template (stock taken through StockService, so invariant 1
 * holds), each with its issuance log row, expiring at `expiresAt`. Raw SQL because issuing 10,000
 * one by one would take most of the test's time budget.
 */
async function seed(t: TestApp, n: number, expiresAt: Date, tag: string): Promise<string> {
  const coupon = await createCoupon(t.url, { totalStock: n });
  const issuedAt = new Date(expiresAt.getTime() - 7 * 86_400_000);
  await t.app.get(TransactionService).inTransaction(async (em) => {
    if (!(await t.app.get(StockService).deduct(em, coupon.id, n))) throw new Error('seed: no stock');
    await em.query(
      `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, issued_at, valid_from, expires_at, updated_at)
       SELECT ?, CONCAT(?, seq), 'UNUSED', 'GRAB', 1, ?, ?, ?, ? FROM seq_1_to_${n}`,
      [coupon.id, `${tag}-`, issuedAt, issuedAt, expiresAt, issuedAt],
    );
    await em.query(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
       SELECT id, NULL, 'UNUSED', CONCAT('seed-', id), 'GRAB', issued_at FROM user_coupon WHERE coupon_id = ?`,
      [coupon.id],
    );
  });
  return coupon.id;
}

describe('expiry sweep', () => {
  let t: TestApp;
  let expiry: ExpiryService;
  let tx: TransactionService;
  beforeAll(async () => {
    t = await startTestApp({ EXPIRE_BATCH_SIZE: '1000' });
    expiry = t.app.get(ExpiryService);
    tx = t.app.get(TransactionService);
  });
  afterAll(() => t.close());

  const count = async (sql: string, params: unknown[] = []) => Number(((await t.db.query(sql, params)) as { n: string }[])[0].n);
  const byStatus = async (couponId: string) =>
    Object.fromEntries(
      (
        (await t.db.query(`SELECT status, COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? GROUP BY status`, [couponId])) as {
          status: string;
          n: string;
        }[]
      ).map((r) => [r.status, Number(r.n)]),
    );
  const expiredLogRows = (couponId: string) =>
    count(
      `SELECT COUNT(*) AS n FROM user_coupon_state_log l JOIN user_coupon uc ON uc.id = l.user_coupon_id WHERE uc.coupon_id = ? AND l.to_status = 'EXPIRED'`,
      [couponId],
    );

  it('expires 10,000 coupons in batches while 1,000 redemptions race it: each ends USED or EXPIRED, never both, each move logged once', async () => {
    const couponId = await seed(t, 10_000, new Date(Date.now() - MINUTE), 'race');
    const notYet = await seed(t, 50, new Date(Date.now() + 60 * MINUTE), 'later');
    const ids = (
      (await t.db.query(`SELECT id FROM user_coupon WHERE coupon_id = ? ORDER BY RAND() LIMIT 1000`, [couponId])) as { id: string }[]
    ).map((r) => r.id);
    const sm = t.app.get(StateMachineService);
    const outcomes: Record<string, number> = {};
    const redeem = async (id: string) => {
      const code = await tx
        .inTransaction(async (em) => {
          await sm.transit(em, id, 'UNUSED', 'USED', `order:race-${id}`, 'redeemed');
          await em.query(
            `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at) SELECT id, ?, user_id, 20000, 1000, 'USED', used_at FROM user_coupon WHERE id = ?`,
            [`race-${id}`, id],
          );
        })
        .then(
          () => 'USED',
          (e: unknown) => (e instanceof AppError ? e.code : String(e)),
        );
      outcomes[code] = (outcomes[code] ?? 0) + 1;
    };
    const queue = [...ids];
    const workers = Array.from({ length: 12 }, async () => {
      for (let id = queue.pop(); id !== undefined; id = queue.pop()) await redeem(id);
    });
    const [result] = await Promise.all([expiry.sweep(), ...workers]);

    expect(Object.keys(outcomes).every((k) => k === 'USED' || k === 'STATUS_CONFLICT')).toBe(true);
    const used = outcomes.USED ?? 0;
    expect(used + (outcomes.STATUS_CONFLICT ?? 0)).toBe(1000);
    expect(result.complete).toBe(true);
    expect(result.expired).toBe(10_000 - used);
    expect(result.batches).toBe(Math.floor((10_000 - used) / 1000) + 1);
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 10_000 - used, ...(used > 0 ? { USED: used } : {}) });
    expect(await byStatus(notYet)).toEqual({ UNUSED: 50 });
    expect(await expiredLogRows(couponId)).toBe(10_000 - used);
    expect(
      await count(
        `SELECT COUNT(*) AS n FROM (SELECT user_coupon_id FROM user_coupon_state_log WHERE to_status IN ('USED', 'EXPIRED') GROUP BY user_coupon_id HAVING COUNT(*) > 1) x`,
      ),
    ).toBe(0);
    expect(
      await count(`SELECT COUNT(*) AS n FROM redemption r JOIN user_coupon uc ON uc.id = r.user_coupon_id WHERE uc.status <> 'USED'`),
    ).toBe(0);
    expect(await checkInvariants(t.db)).toEqual([]);
    console.log(
      `sweep of 10,000 with 1,000 racing redemptions: ${JSON.stringify(outcomes)}, ${result.batches} batches, ${Math.round(result.durationMs)} ms`,
    );
  });

  it('stopped half-way (batch limit, abort, or a batch rolled back) leaves only whole batches done; the next run finishes', async () => {
    const couponId = await seed(t, 5_000, new Date(Date.now() - MINUTE), 'halt');
    const first = await expiry.sweep({ maxBatches: 2 });
    expect(first).toMatchObject({ expired: 2000, batches: 2, complete: false });
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 2000, UNUSED: 3000 });

    const stop = new AbortController();
    const second = expiry.sweep({ signal: stop.signal });
    stop.abort();
    expect(await second).toMatchObject({ expired: 1000, batches: 1, complete: false });

    // A crash between the UPDATE and the commit: the batch is rolled back whole.
    const crash = tx.inTransaction(async (em) => {
      expect(await expiry.expireBatch(em, new Date(), 1000, 'doomed')).toBe(1000);
      throw new Error('process killed');
    });
    await expect(crash).rejects.toThrow('process killed');
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 3000, UNUSED: 2000 });
    expect(await count(`SELECT COUNT(*) AS n FROM user_coupon_state_log WHERE tx_id = 'doomed'`)).toBe(0);

    const last = await expiry.sweep();
    expect(last).toMatchObject({ expired: 2000, complete: true });
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 5000 });
    expect(await expiredLogRows(couponId)).toBe(5000);
    expect(await expiry.sweep()).toMatchObject({ expired: 0, batches: 1, complete: true });
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it('skips a coupon a redemption holds locked instead of waiting for it, and expires it on a later run', async () => {
    const couponId = await seed(t, 3, new Date(Date.now() - MINUTE), 'held');
    const [held] = (await t.db.query(`SELECT id FROM user_coupon WHERE coupon_id = ? ORDER BY id LIMIT 1`, [couponId])) as { id: string }[];
    const runner = t.db.createQueryRunner();
    await runner.connect();
    try {
      await runner.startTransaction();
      await runner.query(`SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`, [held.id]);
      const started = Date.now();
      expect(await expiry.sweep()).toMatchObject({ expired: 2, complete: true });
      expect(Date.now() - started).toBeLessThan(5000);
      await runner.rollbackTransaction();
    } finally {
      await runner.release();
    }
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 2, UNUSED: 1 });
    expect(await expiry.sweep()).toMatchObject({ expired: 1 });
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 3 });
  });

  it('runs under the expire lease: skipped while another instance holds it, runs once it is free', async () => {
    const couponId = await seed(t, 10, new Date(Date.now() - MINUTE), 'lock');
    // t.db is a pool of its own, as another instance's would be.
    const other = await tryAcquireLease(t.db, EXPIRY_LEASE, { ttlMs: 60_000, retries: 2 });
    expect(other).not.toBeNull();
    try {
      expect(await expiry.runExclusive()).toBeNull();
      expect(await byStatus(couponId)).toEqual({ UNUSED: 10 });
    } finally {
      await other?.release();
    }
    expect(await expiry.runExclusive()).toMatchObject({ expired: 10, complete: true });
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 10 });
    // The sweep released its lease: another run can take it at once.
    expect(await expiry.runExclusive()).toMatchObject({ expired: 0 });
  });

  it("runs a cron tick once across the instances: one whose timer fires after another's run ended skips it; the next tick runs", async () => {
    const skipped = async () => {
      const text = (await request(t.url).get('/metrics')).text;
      return Number(/^expiry_sweep_runs_total\{outcome="skipped"\} (\d+)/m.exec(text)?.[1] ?? 0);
    };
    const couponId = await seed(t, 3, new Date(Date.now() - MINUTE), 'tick');
    const due = new Date();
    const before = await skipped();
    // A run stopped short (shutdown) keeps nothing: the tick is still run by the next timer.
    await expiry.runScheduled(AbortSignal.abort(), due);
    expect(await byStatus(couponId)).toEqual({ UNUSED: 3 });
    await expiry.runScheduled(new AbortController().signal, due);
    expect(await byStatus(couponId)).toEqual({ EXPIRED: 3 });
    expect(await skipped()).toBe(before);
    // Another instance's timer for the same tick, a moment later: the tick was run.
    await expiry.runScheduled(new AbortController().signal, due);
    expect(await skipped()).toBe(before + 1);
    // The next tick, a second on, runs.
    await new Promise((r) => setTimeout(r, due.getTime() + 1000 - Date.now()));
    expect(await expiry.runExclusive()).toMatchObject({ complete: true });
    expect(await skipped()).toBe(before + 1);
  });

  it('reports rows done and duration on /metrics', async () => {
    const res = await request(t.url).get('/metrics');
    expect(res.text).toMatch(/^expiry_sweep_rows_total \d+/m);
    expect(Number(/^expiry_sweep_rows_total (\d+)/m.exec(res.text)?.[1])).toBeGreaterThanOrEqual(5000);
    expect(res.text).toMatch(/^expiry_sweep_duration_seconds_count\{outcome="complete"\} \d+/m);
    expect(res.text).toMatch(/^expiry_sweep_runs_total\{outcome="skipped"\} [1-9]/m);
    expect(res.text).toMatch(/^user_coupon_transitions_total\{from="UNUSED",to="EXPIRED"\} \d+/m);
  });
});

describe('expiry cron', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ SCHEDULER_ENABLED: 'true', EXPIRE_CRON: '* * * * * *' });
  });
  afterAll(() => t?.close());

  it('is registered from EXPIRE_CRON and expires past-due coupons on its own', async () => {
    expect(t.app.get(SchedulerRegistry).getCronJob(EXPIRE_JOB).cronTime.source).toBe('* * * * * *');
    const couponId = await seed(t, 20, new Date(Date.now() - MINUTE), 'cron');
    const deadline = Date.now() + 10_000;
    let left = 20;
    while (left > 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 200));
      left = Number(
        (
          (await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND status = 'UNUSED'`, [couponId])) as {
            n: string;
          }[]
        )[0].n,
      );
    }
    expect(left).toBe(0);
    expect(await checkInvariants(t.db)).toEqual([]);
  });
});
