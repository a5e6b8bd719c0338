import { readFileSync } from 'node:fs';
import { couponBody } from '../support/factories.js';
import { adminToken } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { RUNNER_LEASE } from '../../src/issuance/issuance-runner.js';
import { jobOf, uploadCsv, userIdCsv } from './support/bulk.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, callUntilAnswered, sleep } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

const INSTANCES = 3;
const USERS = 50_000;
const LEASE_TTL_MS = 5000;

/**
 * Three server processes on one database, each with the bulk runner on: one job, uploaded with the
 * same Idempotency-Key to all three at once, is one job, run by one instance at a time (the
 * issuance-runner lease); kill -9 of the one running it, and a survivor carries it to the end.
 */
describe('three instances, one bulk issuance job', () => {
  let fdb: FaultDatabase;
  let servers: Server[] = [];
  const figures = {
    requests: 0,
    faults: 0,
    violations: 0,
    acknowledgedWritesLost: 0,
    samples: 0,
    runnersSeenAtOnce: 0,
    uploadMs: 0,
    killedAtMs: 0,
    takeoverMs: 0,
    jobMs: 0,
  };

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
    servers = await Promise.all(
      Array.from({ length: INSTANCES }, () => startServer({ dbName: fdb.name, env: { LEASE_TTL_MS: String(LEASE_TTL_MS) } })),
    );
  });
  afterAll(async () => {
    report({ scenario: 'three instances, one bulk issuance job', ...figures });
    await Promise.all(servers.map((s) => s.stop()));
    await fdb?.close();
  });

  /** bulk_issued_total of each live instance: how many coupons its runner issued. */
  const issuedBy = (live: readonly Server[]) =>
    Promise.all(
      live.map(async (s) =>
        Number(/^bulk_issued_total (\d+)/m.exec((await callUntilAnswered(s.url, 'GET', '/metrics')).body.text as string)?.[1] ?? 0),
      ),
    );
  const holderPid = async () => {
    const [row] = (await fdb.db.query(`SELECT holder FROM job_lease WHERE name = ? AND expires_at > NOW(3)`, [RUNNER_LEASE])) as {
      holder: string | null;
    }[];
    return row?.holder ? Number(row.holder.split(':')[1]) : null;
  };
  const decided = async (jobId: string) => {
    const [j] = (await fdb.db.query(
      `SELECT status, issued + skipped_user_limit + skipped_sold_out + skipped_invalid + skipped_duplicate AS n FROM issuance_job WHERE id = ?`,
      [jobId],
    )) as { status: string; n: string }[];
    return { status: j.status, n: Number(j.n) };
  };
  /**
   * Samples the live instances until `until` holds: at every sample at most one has issued anything,
   * always the same one, and while the job is still running it holds the lease.
   */
  async function watchOneRunner(live: readonly Server[], jobId: string, until: () => Promise<boolean>): Promise<Server> {
    let runner: Server | undefined;
    while (!(await until())) {
      const [issued, pid] = await Promise.all([issuedBy(live), holderPid()]);
      // Once the job is over its runner frees the lease and any instance may take it for its idle poll.
      const stillRunning = (await decided(jobId)).status === 'RUNNING';
      figures.samples++;
      figures.requests += live.length;
      const running = live.filter((_, i) => issued[i] > 0);
      figures.runnersSeenAtOnce = Math.max(figures.runnersSeenAtOnce, running.length);
      expect(running.length).toBeLessThanOrEqual(1);
      if (running.length === 1) {
        runner ??= running[0];
        expect(running[0]).toBe(runner);
        if (stillRunning) expect(pid).toBe(runner.child.pid);
      }
      await sleep(100);
    }
    expect(runner).toBeDefined();
    return runner as Server;
  }

  it('runs once, on one instance at a time, and a survivor finishes it after kill -9 of the runner', async () => {
    const created = await call(servers[0].url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: USERS }) });
    expect(created.status).toBe(201);
    const couponId = created.body.id as string;
    const csv = userIdCsv('tri', USERS);
    const uploads = await Promise.all(servers.map((s) => uploadCsv(s.url, couponId, csv, 'fault-three-instances')));
    figures.uploadMs = Math.max(...uploads.map((u) => u.ms));
    const started = performance.now();
    figures.requests += 1 + uploads.length;
    // One upload wins the key; the others answer its job, or 409 while it is still streaming in.
    const jobIds = new Set(uploads.filter((u) => u.status === 202).map((u) => u.body.jobId as string));
    expect(jobIds.size).toBe(1);
    expect(uploads.every((u) => u.status === 202 || (u.status === 409 && u.body.code === 'IDEMPOTENCY_IN_PROGRESS'))).toBe(true);
    const [jobId] = jobIds;
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM issuance_job WHERE status <> 'DISCARDED'`)).toBe(1);

    const runner = await watchOneRunner(servers, jobId, async () => (await decided(jobId)).n >= USERS * 0.3);
    expect((await decided(jobId)).status).toBe('RUNNING');
    await runner.crash();
    figures.faults++;
    const atKill = (await decided(jobId)).n;
    const issuedAtKill = await count(fdb.db, `SELECT issued AS n FROM issuance_job WHERE id = ?`, [jobId]);
    expect(atKill).toBeLessThan(USERS);
    const survivors = servers.filter((s) => s !== runner);
    servers = survivors;

    const killedAt = performance.now();
    figures.killedAtMs = Math.round(killedAt - started);
    const next = await watchOneRunner(survivors, jobId, async () => {
      expect(performance.now() - killedAt).toBeLessThan(120_000);
      if (figures.takeoverMs === 0 && (await decided(jobId)).n > atKill) figures.takeoverMs = Math.round(performance.now() - killedAt);
      return (await decided(jobId)).status !== 'RUNNING';
    });
    expect(survivors).toContain(next);
    figures.jobMs = Math.round(performance.now() - started);

    const job = await jobOf(next.url, jobId);
    expect(job).toMatchObject({ status: 'COMPLETED', total: USERS, issued: USERS, skipped: 0 });
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId])).toBe(USERS);
    expect(await count(fdb.db, `SELECT COUNT(DISTINCT user_id) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId])).toBe(USERS);
    expect(await count(fdb.db, `SELECT stock AS n FROM coupon_stock WHERE coupon_id = ?`, [couponId])).toBe(0);
    // The survivor issued exactly what was left at the kill: the dead runner's batch in flight was rolled back, not done twice.
    expect((await issuedBy(survivors)).reduce((a, b) => a + b, 0)).toBe(USERS - issuedAtKill);
    // The idle instances polled for the lease every second all along without piling up abort listeners.
    for (const s of survivors) expect(readFileSync(s.logFile, 'utf8')).not.toContain('MaxListenersExceededWarning');
    const violations = await checkInvariants(fdb.db);
    figures.violations = violations.length;
    expect(violations).toEqual([]);
  });
});
