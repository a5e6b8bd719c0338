import { couponBody } from '../support/factories.js';
import { adminToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, callUntilAnswered, mapConcurrent, Reply, sleep } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, cronAt, Server, startServer } from './support/server.js';

const INSTANCES = 3;
const GRABS = 5000;
const STOCK = 1000;
const EXPIRING = 300;

/**
 * Three server processes on one database, sharing rate-limit buckets through Redis: 5,000 grabs
 * of 1,000 stock spread over them at once issue exactly 1,000. Then the expiry sweep and the
 * reconciliation run, scheduled for the same second on all three, each happen once.
 */
describe('three instances on one database', () => {
  let fdb: FaultDatabase;
  let servers: Server[] = [];
  /** How long the first start of all instances took, in ms. */
  let startMs = 0;
  const figures = {
    requests: 0,
    faults: 0,
    violations: 0,
    acknowledgedWritesLost: 0,
    answered503: 0,
    expirySweepsComplete: 0,
    expirySweepsSkipped: 0,
    reconcileRuns: 0,
  };
  const env = {
    DB_POOL_SIZE: '10',
    REDIS_URL: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
    RATE_LIMIT_ENABLED: 'true',
    RATE_LIMIT_PER_SECOND: '1000000',
    RATE_LIMIT_PER_USER_PER_SECOND: '1000',
  };
  const startAll = (extra: Record<string, string> = {}) =>
    Promise.all(Array.from({ length: INSTANCES }, () => startServer({ dbName: fdb.name, env: { ...env, ...extra } })));
  const stopAll = async () => {
    await Promise.all(servers.map((s) => s.stop()));
    servers = [];
  };
  const on = (i: number) => servers[i % servers.length].url;
  const grab = (i: number, couponId: string, user: string, key: string) => {
    figures.requests++;
    return call(on(i), 'POST', `/coupons/${couponId}/grab`, {
      token: tokenFor(user),
      headers: { 'idempotency-key': key },
      timeoutMs: 120_000,
    });
  };
  const createCoupon = async (overrides: Parameters<typeof couponBody>[0]) => {
    const created = await call(on(0), 'POST', '/admin/coupons', { token: adminToken(), body: couponBody(overrides) });
    expect(created.status).toBe(201);
    return created.body.id as string;
  };
  const tally = (replies: Reply[]) =>
    replies.reduce<Record<string, number>>(
      (acc, r) => ({ ...acc, [`${r.status} ${r.body.code ?? ''}`.trim()]: (acc[`${r.status} ${r.body.code ?? ''}`.trim()] ?? 0) + 1 }),
      {},
    );

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
    const started = Date.now();
    servers = await startAll();
    startMs = Date.now() - started;
  });
  afterAll(async () => {
    figures.violations = (await checkInvariants(fdb.db)).length;
    report({ scenario: 'three instances, one database', ...figures });
    await stopAll();
    await fdb?.close();
  });

  it(`${GRABS} concurrent grabs of ${STOCK} stock over ${INSTANCES} instances issue exactly ${STOCK}`, async () => {
    const couponId = await createCoupon({ totalStock: STOCK });
    // A 503 is an honest outage answer (on a starved machine a pool connection can take over connectTimeout to open);
    // the client retries it with the same key, as API.md asks, and the final answers are what must add up.
    const replies = await Promise.all(
      Array.from({ length: GRABS }, async (_, i) => {
        let r = await grab(i, couponId, `mi-${i}`, `mi-key-${i}`);
        for (let attempt = 1; r.status === 503 && attempt < 20; attempt++) {
          figures.answered503++;
          await sleep(200);
          r = await grab(i + attempt, couponId, `mi-${i}`, `mi-key-${i}`);
        }
        return r;
      }),
    );
    expect(tally(replies)).toEqual({ '201': STOCK, '409 SOLD_OUT': GRABS - STOCK });
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId])).toBe(STOCK);
    expect(await count(fdb.db, `SELECT stock AS n FROM coupon_stock WHERE coupon_id = ?`, [couponId])).toBe(0);
    const ids = new Set(replies.filter((r) => r.status === 201).map((r) => r.body.id));
    expect(ids.size).toBe(STOCK);
    const stored = (await fdb.db.query(`SELECT id FROM user_coupon WHERE coupon_id = ?`, [couponId])) as { id: string }[];
    figures.acknowledgedWritesLost += [...ids].filter((id) => !stored.some((s) => String(s.id) === id)).length;
    expect(figures.acknowledgedWritesLost).toBe(0);
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });

  it('one user racing on all instances gets at most the per-user limit, one key at most one coupon', async () => {
    const couponId = await createCoupon({ totalStock: 100, perUserLimit: 2 });
    const distinctKeys = await Promise.all(Array.from({ length: 60 }, (_, i) => grab(i, couponId, 'greedy', `greedy-${i}`)));
    expect(tally(distinctKeys)).toEqual({ '201': 2, '409 USER_LIMIT_REACHED': 58 });
    const sameKey = await Promise.all(Array.from({ length: 30 }, (_, i) => grab(i, couponId, 'clicker', 'one-key')));
    expect(new Set(sameKey.filter((r) => r.status === 201).map((r) => r.body.id)).size).toBe(1);
    expect(sameKey.every((r) => r.status === 201 || (r.status === 409 && r.body.code === 'IDEMPOTENCY_IN_PROGRESS'))).toBe(true);
    expect(
      await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND user_id IN ('greedy', 'clicker')`, [couponId]),
    ).toBe(3);
  });

  it('a reconciliation run requested on all instances at once starts once; the others answer 409 RECONCILIATION_RUNNING', async () => {
    const before = await count(fdb.db, `SELECT COUNT(*) AS n FROM reconciliation_run`);
    const replies = await Promise.all(
      servers.map((s) => call(s.url, 'POST', '/admin/reconciliation/runs', { token: adminToken(), body: { mode: 'FULL' } })),
    );
    figures.requests += replies.length;
    expect(tally(replies)).toEqual({ '202': 1, '409 RECONCILIATION_RUNNING': INSTANCES - 1 });
    const runId = replies.find((r) => r.status === 202)?.body.runId as string;
    let run: Reply;
    do {
      await sleep(200);
      run = await call(on(0), 'GET', `/admin/reconciliation/runs/${runId}`, { token: adminToken() });
    } while (run.body.status === 'RUNNING');
    expect([run.body.status, run.body.discrepancies]).toEqual(['COMPLETED', 0]);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM reconciliation_run`)).toBe(before + 1);
  });

  it('the expiry sweep and the reconciliation run, scheduled for the same second on all three, each run once', async () => {
    // Long enough for every grab to come before it on a loaded machine: grabbing ends with the validity.
    const validUntil = new Date(Date.now() + 10_000);
    const couponId = await createCoupon({
      totalStock: EXPIRING,
      validity: { type: 'FIXED', startAt: new Date(Date.now() - 3600_000).toISOString(), endAt: validUntil.toISOString() },
    });
    const grabbed = await mapConcurrent(
      Array.from({ length: EXPIRING }, (_, i) => i),
      50,
      (i) => grab(i, couponId, `exp-${i}`, `exp-key-${i}`),
    );
    expect(tally(grabbed)).toEqual({ '201': EXPIRING });

    // Restarted with both jobs due at fixed seconds a little ahead, after the coupons have expired.
    // The lead scales with how long the first start took: on a loaded machine three cold starts can
    // take longer than 15 s, and a job due before its instance is up never runs there.
    await stopAll();
    const sweepAt = new Date(Math.max(Date.now(), validUntil.getTime()) + Math.max(15_000, 3 * startMs));
    const reconcileAt = new Date(sweepAt.getTime() + 3000);
    servers = await startAll({
      SCHEDULER_ENABLED: 'true',
      EXPIRE_CRON: cronAt(sweepAt),
      RECONCILE_CRON: cronAt(reconcileAt),
      RECONCILE_TIMEZONE: 'UTC',
    });
    expect(Date.now()).toBeLessThan(sweepAt.getTime() - 1000);
    await sleep(reconcileAt.getTime() - Date.now() + 1500);

    const expiredLog = (await fdb.db.query(
      `SELECT l.tx_id, COUNT(*) AS n FROM user_coupon_state_log l JOIN user_coupon uc ON uc.id = l.user_coupon_id WHERE uc.coupon_id = ? AND l.to_status = 'EXPIRED' GROUP BY l.tx_id`,
      [couponId],
    )) as { tx_id: string; n: string }[];
    // All 300 expired by one sweep run, each with one log row: no second instance swept any of them.
    expect(expiredLog.map((r) => Number(r.n))).toEqual([EXPIRING]);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND status = 'EXPIRED'`, [couponId])).toBe(
      EXPIRING,
    );
    for (const s of servers) {
      const metrics = (await callUntilAnswered(s.url, 'GET', '/metrics')).body.text as string;
      figures.expirySweepsComplete += Number(/^expiry_sweep_runs_total\{outcome="complete"\} (\d+)/m.exec(metrics)?.[1] ?? 0);
      figures.expirySweepsSkipped += Number(/^expiry_sweep_runs_total\{outcome="skipped"\} (\d+)/m.exec(metrics)?.[1] ?? 0);
    }
    expect(figures.expirySweepsComplete + figures.expirySweepsSkipped).toBe(INSTANCES);
    expect(figures.expirySweepsComplete).toBeGreaterThanOrEqual(1);

    let cronRuns: { status: string; discrepancies: string }[] = [];
    for (let i = 0; i < 100; i++) {
      cronRuns = (await fdb.db.query(`SELECT status, discrepancies FROM reconciliation_run WHERE triggered_by = 'cron'`)) as {
        status: string;
        discrepancies: string;
      }[];
      if (cronRuns.length > 0 && cronRuns.every((r) => r.status !== 'RUNNING')) break;
      await sleep(200);
    }
    figures.reconcileRuns = cronRuns.length;
    expect(cronRuns.map((r) => [r.status, Number(r.discrepancies)])).toEqual([['COMPLETED', 0]]);
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });
});
