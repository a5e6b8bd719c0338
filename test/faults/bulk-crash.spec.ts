import { couponBody } from '../support/factories.js';
import { adminToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { jobOf, uploadCsv, userIdCsv } from './support/bulk.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, mapConcurrent, sleep } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

const USERS = 300_000;
const GRABBED = 50;
const REPEATS = 100;
const INVALID = ['not valid!', 'ü-ser', 'a'.repeat(65)];
/** Short, so the restarted process takes the dead one's lease over in seconds rather than 30. */
const LEASE_TTL_MS = 5000;

/**
 * kill -9 of the server running a 300,000-user bulk job, then a new process on the same database:
 * the job continues by itself from its cursor and completes, and every listed user holds the coupon
 * exactly once, counted in the database.
 */
describe('kill -9 in the middle of a 300,000-user bulk issuance job', () => {
  let fdb: FaultDatabase;
  let server: Server | undefined;
  const figures = {
    requests: 0,
    faults: 0,
    violations: 0,
    acknowledgedWritesLost: 0,
    lines: 0,
    uploadMs: 0,
    decidedAtKill: 0,
    takeoverMs: 0,
    jobMs: 0,
  };
  const env = { LEASE_TTL_MS: String(LEASE_TTL_MS) };

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
  });
  afterAll(async () => {
    report({ scenario: 'kill -9 during a bulk issuance job', ...figures });
    await server?.stop();
    await fdb?.close();
  });

  it('resumes by itself after a restart and issues every user exactly once', async () => {
    server = await startServer({ dbName: fdb.name, env });
    // Stock for every listed user exactly: the first 50 grab theirs before the job and are skipped at their limit.
    const created = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: USERS }) });
    expect(created.status).toBe(201);
    const couponId = created.body.id as string;
    const grabs = await mapConcurrent(
      Array.from({ length: GRABBED }, (_, i) => i),
      10,
      (i) =>
        call((server as Server).url, 'POST', `/coupons/${couponId}/grab`, {
          token: tokenFor(`bk${i}`),
          headers: { 'idempotency-key': `pre-${i}` },
        }),
    );
    expect(grabs.map((g) => g.status)).toEqual(Array(GRABBED).fill(201));

    const repeats = Array.from({ length: REPEATS }, (_, i) => `bk${i * 7 + 3}`);
    const csv = userIdCsv('bk', USERS, [...repeats, ...INVALID]);
    const lines = USERS + REPEATS + INVALID.length;
    figures.lines = lines;
    const upload = await uploadCsv(server.url, couponId, csv, 'fault-bulk-crash');
    figures.requests += GRABBED + 1;
    figures.uploadMs = upload.ms;
    expect(upload.status).toBe(202);
    const jobId = upload.body.jobId as string;
    const key = `bulk:${jobId}`;

    // Killed once the runner is a good way in, but far from done.
    const decided = async () => {
      const [j] = (await fdb.db.query(
        `SELECT status, issued + skipped_user_limit + skipped_sold_out + skipped_invalid + skipped_duplicate AS n FROM issuance_job WHERE id = ?`,
        [jobId],
      )) as { status: string; n: string }[];
      return { status: j.status, n: Number(j.n) };
    };
    const jobStarted = performance.now();
    for (let d = await decided(); d.n < lines * 0.3; d = await decided()) {
      expect(d.status).not.toBe('COMPLETED');
      await sleep(50);
    }
    await server.crash();
    figures.faults++;
    server = undefined;
    const atKill = await decided();
    figures.decidedAtKill = atKill.n;
    expect(atKill.status).toBe('RUNNING');
    expect(atKill.n).toBeLessThan(lines * 0.8);
    // The batch in flight died with the process: what the job counts is exactly what is stored.
    const bulkRows = () =>
      count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND idempotency_key = ?`, [couponId, key]);
    const [{ issued }] = (await fdb.db.query(`SELECT issued FROM issuance_job WHERE id = ?`, [jobId])) as { issued: string }[];
    expect(await bulkRows()).toBe(Number(issued));

    const restartedAt = performance.now();
    server = await startServer({ dbName: fdb.name, env });
    for (let d = await decided(); d.n === atKill.n; d = await decided()) {
      // The dead holder's lease expires after LEASE_TTL_MS, and the new process polls every second.
      expect(performance.now() - restartedAt).toBeLessThan(60_000);
      await sleep(50);
    }
    figures.takeoverMs = Math.round(performance.now() - restartedAt);
    let job = await jobOf(server.url, jobId);
    while (job.status === 'RUNNING') {
      expect(performance.now() - restartedAt).toBeLessThan(240_000);
      await sleep(250);
      job = await jobOf(server.url, jobId);
    }
    figures.jobMs = Math.round(performance.now() - jobStarted);
    figures.requests += 1;

    expect(job).toMatchObject({
      status: 'COMPLETED',
      total: lines,
      issued: USERS - GRABBED,
      skipped: GRABBED + REPEATS + INVALID.length,
      skippedByReason: { USER_LIMIT_REACHED: GRABBED, SOLD_OUT: 0, INVALID_USER_ID: INVALID.length, DUPLICATE: REPEATS },
    });
    expect(job.issued + job.skipped).toBe(lines);
    // Every listed user holds the coupon exactly once: 300,000 distinct holders, no one twice.
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId])).toBe(USERS);
    expect(await count(fdb.db, `SELECT COUNT(DISTINCT user_id) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId])).toBe(USERS);
    expect(
      await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND user_id NOT REGEXP '^bk[0-9]+$'`, [couponId]),
    ).toBe(0);
    expect(await bulkRows()).toBe(USERS - GRABBED);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM issuance_job_skip WHERE job_id = ?`, [jobId])).toBe(job.skipped);
    // One issue log row per coupon; the stock went to exactly the coupons taken from it.
    expect(
      await count(
        fdb.db,
        `SELECT COUNT(*) AS n FROM user_coupon_state_log l JOIN user_coupon uc ON uc.id = l.user_coupon_id WHERE uc.coupon_id = ? AND l.from_status IS NULL`,
        [couponId],
      ),
    ).toBe(USERS);
    expect(await count(fdb.db, `SELECT stock AS n FROM coupon_stock WHERE coupon_id = ?`, [couponId])).toBe(0);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND from_stock = 1`, [couponId])).toBe(USERS);
    const violations = await checkInvariants(fdb.db);
    figures.violations = violations.length;
    expect(violations).toEqual([]);
  });
});
