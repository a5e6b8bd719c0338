// npm run bench:bulk [-- --users 1000000 --grab-rate 100 --baseline-seconds 15]
// Bulk issuance (issue 19): one CSV job of a million users on the shipped server as its own
// process: upload time, job time, issuance rate over the job, the server's peak RSS, and the
// latency of grabs of another coupon during the job against the same grabs without it, in one run.
// Results go to stdout as markdown.
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { DataSource } from 'typeorm';
import { Pool } from 'undici';
import { signToken } from '../src/auth/jwt.js';
import { loadConfig } from '../src/config/app-config.js';
import { dataSourceOptions } from '../src/database/data-source-options.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { createCoupon, dbEnv, dropDatabase, quietServerEnv } from './flash-sale/run-design.js';
import { startServer, type RunningServer } from './flash-sale/server.js';
import { latency, type Latency } from './flash-sale/stats.js';

const { values: opt } = parseArgs({
  options: {
    users: { type: 'string', default: '1000000' },
    'grab-rate': { type: 'string', default: '100' },
    'baseline-seconds': { type: 'string', default: '15' },
  },
});
const USERS = Number(opt.users);
const GRAB_RATE = Number(opt['grab-rate']);
const BASELINE_MS = Number(opt['baseline-seconds']) * 1000;
const JWT_SECRET = randomBytes(24).toString('hex');
const admin = `Bearer ${signToken(JWT_SECRET, 'bench-admin', ['admin'], 3600)}`;
const database = `ce_bench_bulk_${randomBytes(4).toString('hex')}`;
const MiB = 1024 * 1024;
const r0 = (x: number) => Math.round(x).toLocaleString('en-US');
const r1 = (x: number) => x.toFixed(1);
const load = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(' / ');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface JobView {
  status: string;
  total: number;
  issued: number;
  skipped: number;
  startedAt: string | null;
  finishedAt: string | null;
}

async function getJob(server: RunningServer, jobId: string): Promise<JobView> {
  const res = await fetch(`${server.url}/admin/issuance-jobs/${jobId}`, { headers: { authorization: admin } });
  if (res.status !== 200) throw new Error(`GET job ${jobId}: ${res.status} ${await res.text()}`);
  return (await res.json()) as JobView;
}

/**
 * Grabs of one coupon at a steady `rate` per second (open loop: a slow answer does not slow the
 * sending), each by its own user with its own key, until stopped. Latency is send to last byte.
 */
class SteadyGrabs {
  readonly latencies: number[] = [];
  readonly statuses = new Map<number, number>();
  private readonly pool: Pool;
  private n = 0;
  private running: Promise<void>[] = [];
  private timer: NodeJS.Timeout | null = null;

  constructor(
    url: string,
    private readonly couponId: string,
    private readonly rate: number,
    private readonly round: string,
  ) {
    this.pool = new Pool(url, { connections: 50, pipelining: 1 });
  }

  start(): void {
    this.timer = setInterval(() => this.running.push(this.one()), 1000 / this.rate);
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await Promise.all(this.running);
  }

  async close(): Promise<void> {
    await this.pool.close();
  }

  private async one(): Promise<void> {
    const i = this.n++;
    const user = `${this.round}-g${i}`;
    const authorization = `Bearer ${signToken(JWT_SECRET, user, [], 3600)}`;
    const started = performance.now();
    let status = 0;
    try {
      const res = await this.pool.request({
        path: `/coupons/${this.couponId}/grab`,
        method: 'POST',
        headers: { authorization, 'idempotency-key': `${user}-k`, 'content-length': '0' },
      });
      status = res.statusCode;
      await res.body.text();
    } catch {
      // Counted as status 0.
    }
    this.latencies.push(performance.now() - started);
    this.statuses.set(status, (this.statuses.get(status) ?? 0) + 1);
  }
}

async function grabsFor(server: RunningServer, couponId: string, round: string, until: () => Promise<unknown>) {
  const grabs = new SteadyGrabs(server.url, couponId, GRAB_RATE, round);
  grabs.start();
  try {
    await until();
  } finally {
    await grabs.stop();
    await grabs.close();
  }
  return { latency: latency(grabs.latencies) as Latency, statuses: Object.fromEntries(grabs.statuses) };
}

/** Innodb_buffer_pool_reads: reads the buffer pool could not answer, since the server started. */
async function diskReads(db: DataSource): Promise<number> {
  const [row] = (await db.query(`SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_reads'`)) as { Value: string }[];
  return Number(row.Value);
}

const csvOf = (n: number) => Buffer.from(`user_id\n${Array.from({ length: n }, (_, i) => `bulk${i}`).join('\n')}\n`);

async function main(): Promise<void> {
  const loadAtStart = load();
  const server = await startServer({
    entry: 'dist/src/main.js',
    env: {
      ...quietServerEnv(database, JWT_SECRET),
      WEBHOOK_RELAY_ENABLED: 'false',
      BULK_RUNNER_ENABLED: 'true',
      ...(process.env.BULK_BATCH_SIZE ? { BULK_BATCH_SIZE: process.env.BULK_BATCH_SIZE } : {}),
    },
  });
  const db = new DataSource({ ...dataSourceOptions(loadConfig({ ...dbEnv(), DB_NAME: database })), poolSize: 2 });
  await db.initialize();
  const lines: string[] = [];
  try {
    const bulkCoupon = await createCoupon(server.url, admin, USERS);
    const grabCoupon = await createCoupon(server.url, admin, 1_000_000);
    const rssIdle = server.rss();
    const [{ mib: bufferPoolMiB }] = (await db.query(`SELECT @@innodb_buffer_pool_size / 1048576 AS mib`)) as { mib: number }[];

    // 1. Grabs of the other coupon with no job running.
    const baseline = await grabsFor(server, grabCoupon, 'base', () => sleep(BASELINE_MS));

    // 2. The upload: a million lines, about 11 MB, in one text/csv body.
    const csv = csvOf(USERS);
    const cpu0 = server.cpuSeconds();
    const uploadStarted = performance.now();
    const res = await fetch(`${server.url}/admin/coupons/${bulkCoupon}/issuances?reason=bench&fromStock=true`, {
      method: 'POST',
      headers: { authorization: admin, 'idempotency-key': 'bench-bulk', 'content-type': 'text/csv' },
      body: csv,
    });
    const uploadMs = performance.now() - uploadStarted;
    const { jobId } = (await res.json()) as { jobId: string };
    if (res.status !== 202) throw new Error(`upload answered ${res.status}`);
    const cpuUpload = server.cpuSeconds() - cpu0;
    const peakAfterUpload = server.peakRss();

    // 3. The job, with the same grabs of the other coupon alongside; progress sampled every 250 ms.
    const samples: { ms: number; decided: number; diskReads: number }[] = [];
    const jobStarted = performance.now();
    let job: JobView = await getJob(server, jobId);
    const during = await grabsFor(server, grabCoupon, 'during', async () => {
      while (job.status === 'QUEUED' || job.status === 'RUNNING') {
        await sleep(250);
        job = await getJob(server, jobId);
        samples.push({ ms: performance.now() - jobStarted, decided: job.issued + job.skipped, diskReads: await diskReads(db) });
      }
    });
    const jobMs = performance.now() - jobStarted;
    const cpuJob = server.cpuSeconds() - cpu0 - cpuUpload;
    const peakRss = server.peakRss();
    const loadAtEnd = load();
    if (job.status !== 'COMPLETED' || job.issued !== USERS) throw new Error(`job ended ${JSON.stringify(job)}`);
    const runMs = Date.parse(job.finishedAt as string) - Date.parse(job.startedAt as string);

    // Issuance rate in each tenth of the job: the time from k/10 to (k+1)/10 of the lines decided.
    const at = (share: number) => {
      const target = USERS * share;
      const i = samples.findIndex((s) => s.decided >= target);
      if (i <= 0) return i === 0 ? samples[0].ms * (target / Math.max(1, samples[0].decided)) : NaN;
      const [a, b] = [samples[i - 1], samples[i]];
      return a.ms + ((b.ms - a.ms) * (target - a.decided)) / Math.max(1, b.decided - a.decided);
    };
    const firstAt = at(0.001);
    // Pages InnoDB had to read from disk per 1,000 lines in each tenth (server-wide: other databases' reads count too).
    const readsAt = (share: number) => samples.find((x) => x.decided >= USERS * share)?.diskReads ?? NaN;
    const readsPerTenth = Array.from(
      { length: 10 },
      (_, k) => ((readsAt((k + 1) / 10) - readsAt(k === 0 ? 0 : k / 10)) / (USERS / 10)) * 1000,
    );
    const deciles = Array.from({ length: 10 }, (_, k) => (USERS / 10 / (at((k + 1) / 10) - (k === 0 ? firstAt : at(k / 10)))) * 1000);

    const counted = Number(
      (
        (await db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND source = 'BULK'`, [bulkCoupon])) as { n: string }[]
      )[0].n,
    );
    const distinct = Number(
      ((await db.query(`SELECT COUNT(DISTINCT user_id) AS n FROM user_coupon WHERE coupon_id = ?`, [bulkCoupon])) as { n: string }[])[0].n,
    );
    const checkStarted = performance.now();
    const violations = await checkInvariants(db);
    const checkMs = performance.now() - checkStarted;

    const lat = (l: Latency) => `${r1(l.p50)} / ${r1(l.p99)} / ${r1(l.max)} ms (n = ${r0(l.count)})`;
    lines.push(
      `| upload: ${r0(USERS)} lines (${r1(csv.length / MiB)} MiB) in one text/csv body, POST to 202 | ${r1(uploadMs / 1000)} s (${r0((USERS / uploadMs) * 1000)} lines/s, server CPU ${r1(cpuUpload)} s) |`,
      `| job: 202 to COMPLETED (polled every 250 ms); startedAt to finishedAt | ${r1(jobMs / 1000)} s; ${r1(runMs / 1000)} s (${r0((USERS / runMs) * 1000)} coupons/s with their log rows, server CPU ${r1(cpuJob)} s) |`,
      `| issuance rate in each tenth of the job, lines/s | ${deciles.map((d) => r0(d)).join(', ')} |`,
      `| last tenth ÷ first tenth | ${(deciles[9] / deciles[0]).toFixed(2)} |`,
      `| InnoDB pages read from disk per 1,000 lines in each tenth (whole server; buffer pool ${r0(bufferPoolMiB)} MiB) | ${readsPerTenth.map((d) => r0(d)).join(', ')} |`,
      `| server RSS: idle; peak after the upload; peak over the whole run (VmHWM) | ${r0(rssIdle / MiB)}; ${r0(peakAfterUpload / MiB)}; ${r0(peakRss / MiB)} MiB |`,
      `| grabs of another coupon at ${GRAB_RATE}/s, no job: p50 / p99 / max | ${lat(baseline.latency)} |`,
      `| the same grabs during the job: p50 / p99 / max | ${lat(during.latency)} |`,
      `| during ÷ without, p50 / p99 | ${(during.latency.p50 / baseline.latency.p50).toFixed(2)} / ${(during.latency.p99 / baseline.latency.p99).toFixed(2)} |`,
      `| grab answers (status: count), without / during | ${JSON.stringify(baseline.statuses)} / ${JSON.stringify(during.statuses)} |`,
      `| checks: BULK coupons, distinct holders, invariant violations (checker ${r1(checkMs / 1000)} s) | ${r0(counted)}, ${r0(distinct)}, ${violations.length} |`,
      `| load average (1 / 5 / 15 min) at start; at end | ${loadAtStart}; ${loadAtEnd} |`,
    );
    if (counted !== USERS || distinct !== USERS || violations.length > 0) {
      console.error(violations.slice(0, 20).join('\n'));
      process.exitCode = 1;
    }
  } finally {
    await server.stop();
    await db.destroy();
    await dropDatabase(database);
  }
  console.log(
    [
      `Command: \`npm run bench:bulk -- --users ${USERS} --grab-rate ${GRAB_RATE} --baseline-seconds ${BASELINE_MS / 1000}\` · ${new Date().toISOString()} · ${os.cpus().length} × ${os.cpus()[0]?.model.split(' ').slice(0, 2).join(' ')}, Node ${process.version}`,
      '',
      '| measure | result |',
      '|---|---|',
      ...lines,
    ].join('\n'),
  );
}

await main();
