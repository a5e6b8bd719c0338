// Reconciliation benchmark: a full run over N user coupons and their logs, for several N, each in a
// fresh child process (so peak RSS is that run's alone) on a database of its own. Command and
// reading of the figures: docs/reconciliation.md.
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { constants as perfConstants, PerformanceObserver } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { INestApplication } from '@nestjs/common';
import mysql from 'mysql2/promise';
import { createApp } from '../src/app.factory.js';
import { AppConfig, loadConfig } from '../src/config/app-config.js';
import { ensureDatabase, migrate } from '../src/database/bootstrap-database.js';
import type { RunView } from '../src/reconciliation/reconciliation-run.entity.js';
import { ReconciliationService } from '../src/reconciliation/reconciliation.service.js';
import { dropTestDatabase } from '../test/support/database.js';

const { values: opt } = parseArgs({
  options: {
    sizes: { type: 'string', default: '100000,250000,500000,1000000' },
    child: { type: 'string' },
    out: { type: 'string', default: 'bench/results' },
    'keep-db': { type: 'boolean', default: false },
    // RECONCILE_CONCURRENCY values compared on the same generated data, alternating run by run.
    concurrency: { type: 'string', default: '1,2' },
    // Fewer for the largest sizes, where one run takes minutes.
    'settled-runs': { type: 'string', default: '3' },
    // InnoDB's buffer pool for the whole benchmark (restored after): the server's default of
    // 128 MiB makes every run disk-bound; a production server gives it a good part of its memory.
    'buffer-pool-mib': { type: 'string' },
    // Longest wait, after the first run, for InnoDB's purge of the load to go quiet before the
    // settled runs (0: no wait).
    'purge-wait-max-s': { type: 'string', default: '600' },
  },
});
const CONCURRENCY = (opt.concurrency ?? '').split(',').map((c) => Number.parseInt(c, 10));

/** User coupons per coupon template: templates grow with N, so every audit's work grows with N. */
const PER_COUPON = 1000;
/** Full runs timed on the settled database, after the first, at each --concurrency value. */
const SETTLED_RUNS = Number.parseInt(opt['settled-runs'] as string, 10);
/** Faults injected per kind; the run must find exactly these. */
const FAULTS = 5;
const PURGE_WAIT_MAX_S = /^\d+$/.test(opt['purge-wait-max-s'] as string) ? Number(opt['purge-wait-max-s']) : NaN;
/**
 * Purge is quiet below this many undo pages a second over PURGE_QUIET_WINDOW_S. It never stops: the
 * service's background writes give it work. The settled runs of 2026-12-07 18:38 saw 4 a second,
 * the two runs in the minutes after the load 38 and 56.
 */
const PURGE_QUIET_PAGES_PER_S = 10;
const PURGE_QUIET_WINDOW_S = 10;

interface SizeResult {
  userCoupons: number;
  coupons: number;
  logRows: number;
  redemptions: number;
  holds: number;
  refunds: number;
  generateSeconds: number;
  /** The first full run, right after the bulk load: slower, reading more pages (BENCHMARKS.md). */
  firstFullRunSeconds: number;
  /** The fastest of the full runs on the settled database: what a nightly run costs. */
  fullRunSeconds: number;
  settledRunSeconds: number[];
  /** The fastest settled full run at each RECONCILE_CONCURRENCY of --concurrency. */
  fullRunSecondsByConcurrency: Record<string, number>;
  incrementalRunSeconds: number;
  checked: number;
  discrepanciesFound: number;
  discrepanciesInjected: number;
  rssBeforeRunMiB: number;
  peakRssDuringRunMiB: number;
  peakHeapUsedDuringRunMiB: number;
  /** The largest heap in use right after a full collection during the runs (null: none happened). */
  peakHeapAfterFullGcMiB: number | null;
  processMaxRssMiB: number;
  microsecondsPerUserCoupon: number;
  /** Pages InnoDB had to read from disk per settled full run: zero while the tables fit in the buffer pool. */
  bufferPoolReadsDuringRun: number;
  /** Data and indexes of the audited tables. */
  tablesMiB: number;
  /** The machine's 1-minute load average when the settled full run started: other work on the 2 cores slows it. */
  loadAverageAtRun: number;
  /** Every full run in order, the first one included, with what the disk and InnoDB did during it. */
  runs: RunIo[];
  /** The wait between the first run and the settled ones for InnoDB's purge to go quiet. */
  purgeWait: PurgeWait;
}

interface PurgeWait {
  seconds: number;
  undoPagesPurged: number;
  /** false: PURGE_WAIT_MAX_S ran out first (or the wait was switched off). */
  quiet: boolean;
}

interface RunIo {
  seconds: number;
  concurrency: number;
  /** Read and written on the machine's disks by every process, MariaDB's included. */
  diskReadMiB: number;
  diskWrittenMiB: number;
  /** InnoDB's own data file reads and writes (its redo log and the file system's journal not included). */
  innodbReadMiB: number;
  innodbWrittenMiB: number;
  /** Of InnoDB's reads, the pages its linear read-ahead fetched (16 KiB each). */
  readAheadMiB: number;
  /** Undo log pages InnoDB's purge processed (innodb_metrics purge_undo_log_pages, enabled for the benchmark). */
  purgedUndoPages: number;
}

const MiB = (bytes: number) => Math.round((bytes / 1048576) * 10) / 10;
const afterGc = (...runs: { peakLiveHeap: number | null }[]) => {
  const seen = runs.map((r) => r.peakLiveHeap).filter((x): x is number => x !== null);
  return seen.length === 0 ? null : MiB(Math.max(...seen));
};

function benchConfig(): AppConfig {
  return loadConfig({
    ...process.env,
    DB_NAME: process.env.BENCH_DB_NAME ?? 'ce_bench_reconcile',
    LOG_LEVEL: 'error',
    SCHEDULER_ENABLED: 'false',
    RATE_LIMIT_ENABLED: 'false',
  });
}

/**
 * Fills the database with `n` consistent user coupons (60% unused, 25% used and redeemed, 10% expired,
 * 5% void), their logs, redemptions, checkout holds, refunds and orders, as the service writes them,
 * then injects FAULTS of each kind. Of the used coupons, two in five went through a checkout hold
 * (CONFIRMED) and one in five was refunded, a replacement coupon returned for it; one coupon in ten
 * was held for a checkout that timed out (RELEASED) and is unused again.
 */
async function generate(
  config: AppConfig,
  n: number,
): Promise<{ coupons: number; logRows: number; redemptions: number; holds: number; refunds: number; injected: number }> {
  const conn = await mysql.createConnection({
    host: config.DB_HOST,
    port: config.DB_PORT,
    user: config.DB_USER,
    password: config.DB_PASSWORD,
    database: config.DB_NAME,
    timezone: 'Z',
  });
  const q = async (sql: string, params: unknown[] = []) => (await conn.query(sql, params))[0] as { affectedRows?: number };
  try {
    const coupons = Math.ceil(n / PER_COUPON);
    await q(`SET SESSION time_zone = '+00:00'`);
    await q(`CREATE TABLE bench_digit (d INT NOT NULL PRIMARY KEY)`);
    await q(`INSERT INTO bench_digit VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)`);
    await q(`CREATE TABLE bench_seq (n INT NOT NULL PRIMARY KEY)`);
    await q(
      `INSERT INTO bench_seq SELECT 1 + a.d + 10*b.d + 100*c.d + 1000*d.d + 10000*e.d + 100000*f.d + 1000000*g.d
       FROM bench_digit a, bench_digit b, bench_digit c, bench_digit d, bench_digit e, bench_digit f, bench_digit g
       WHERE a.d + 10*b.d + 100*c.d + 1000*d.d + 10000*e.d + 100000*f.d + 1000000*g.d < ?`,
      [n],
    );
    const t0 = `UTC_TIMESTAMP(3) - INTERVAL 10 DAY`;
    await q(
      `INSERT INTO coupon (id, name, status, per_user_limit, grab_start_at, grab_end_at, validity_type, validity_days, threshold_cents, discount_cents, return_on_refund, created_at, updated_at)
       SELECT n, CONCAT('bench ', n), 'ACTIVE', 1, ${t0}, ${t0} + INTERVAL 1 DAY, 'RELATIVE', 30, 10000, 1000, 1, ${t0}, ${t0} FROM bench_seq WHERE n <= ?`,
      [coupons],
    );
    // n % 20: 0-11 UNUSED, 12-16 USED, 17-18 EXPIRED, 19 VOID; every 20th (n % 20 = 7) a stock-neutral reissue.
    // Checkout: 14-15 used through a hold, 3-4 held by a checkout that timed out. Refunded: 16, a day
    // after its use; its returned coupon is the 8 of the next twenty (issued then, so a later id; the
    // last twenty's refund returns none, as one past the template's validity).
    const status = `CASE WHEN n % 20 < 12 THEN 'UNUSED' WHEN n % 20 < 17 THEN 'USED' WHEN n % 20 < 19 THEN 'EXPIRED' ELSE 'VOID' END`;
    const returned = `n % 20 = 8 AND n > 20`;
    const refundedAt = `${t0} + INTERVAL 1 DAY`;
    await q(
      `INSERT INTO user_coupon (id, coupon_id, user_id, status, source, from_stock, idempotency_key, replaces_user_coupon_id, reason, issued_at, valid_from, expires_at, used_at, updated_at, locked_until)
       SELECT n, (n - 1) DIV ${PER_COUPON} + 1, CONCAT('user-', IF(${returned}, n - 12, n)), ${status},
              CASE WHEN n % 20 = 7 THEN 'REISSUE' WHEN ${returned} THEN 'REFUND_RETURN' ELSE 'GRAB' END,
              n % 20 <> 7 AND NOT (${returned}), IF(n % 20 = 7 OR ${returned}, NULL, CONCAT('key-', n)),
              IF(${returned}, n - 12, NULL), IF(${returned}, CONCAT('refund r-', n - 12), NULL),
              IF(${returned}, ${refundedAt}, ${t0}), IF(${returned}, ${refundedAt}, ${t0}), IF(${returned}, ${refundedAt}, ${t0}) + INTERVAL 30 DAY,
              IF(n % 20 BETWEEN 12 AND 16, ${t0} + INTERVAL 1 HOUR, NULL), IF(${returned}, ${refundedAt}, ${t0}),
              IF(n % 20 IN (3, 4, 14, 15), ${t0} + INTERVAL 65 MINUTE, NULL)
       FROM bench_seq`,
    );
    await q(
      `INSERT INTO coupon_stock (coupon_id, init_stock, stock, updated_at)
       SELECT coupon_id, SUM(from_stock) + 200, 200, ${t0} FROM user_coupon GROUP BY coupon_id`,
    );
    await q(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
       SELECT id, NULL, 'UNUSED', COALESCE(CONCAT('grab:', idempotency_key), CONCAT('refund:', SUBSTRING(reason, 8)), CONCAT('admin:bench:reissue:', id)),
              COALESCE(reason, source), issued_at
       FROM user_coupon ORDER BY id`,
    );
    // The holds' LOCKED step, then every coupon's last move: a used one's from its hold when it had one
    // (confirmed at the use, an hour in), a timed-out hold's by the sweep at its end.
    const held = `id % 20 IN (3, 4, 14, 15)`;
    const holdOrder = `CONCAT(IF(id % 20 < 12, 'h-', 'o-'), id)`;
    await q(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
       SELECT id, 'UNUSED', 'LOCKED', CONCAT('hold:', ${holdOrder}), 'held', issued_at + INTERVAL 50 MINUTE
       FROM user_coupon WHERE ${held} ORDER BY id`,
    );
    await q(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
       SELECT id, IF(${held}, 'LOCKED', 'UNUSED'), status,
              CASE WHEN status = 'USED' THEN CONCAT('order:o-', id) WHEN ${held} THEN 'hold-sweep:bench' ELSE 'bench' END,
              CASE WHEN status = 'USED' THEN IF(${held}, 'hold confirmed', 'redeemed') WHEN ${held} THEN 'hold released: TIMEOUT' ELSE 'bench' END,
              issued_at + INTERVAL IF(${held} AND status = 'UNUSED', 65, 60) MINUTE
       FROM user_coupon WHERE status <> 'UNUSED' OR ${held} ORDER BY id`,
    );
    await q(
      `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at)
       SELECT id, CONCAT('o-', id), user_id, 20000, 1000, 'USED', used_at FROM user_coupon WHERE status = 'USED' ORDER BY id`,
    );
    await q(
      `INSERT INTO redemption_hold (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, expires_at, created_at, released_at, release_reason)
       SELECT id, ${holdOrder}, user_id, 20000, 1000, IF(status = 'USED', 'CONFIRMED', 'RELEASED'), issued_at + INTERVAL 65 MINUTE,
              issued_at + INTERVAL 50 MINUTE, IF(status = 'USED', NULL, issued_at + INTERVAL 65 MINUTE), IF(status = 'USED', NULL, 'TIMEOUT')
       FROM user_coupon WHERE ${held} ORDER BY id`,
    );
    await q(
      `INSERT INTO refund (refund_no, redemption_id, user_coupon_id, order_no, replacement_user_coupon_id, created_at)
       SELECT CONCAT('r-', user_coupon_id), id, user_coupon_id, order_no, IF(user_coupon_id + 12 <= ${n}, user_coupon_id + 12, NULL), ${refundedAt}
       FROM redemption WHERE user_coupon_id % 20 = 16 ORDER BY id`,
    );
    await q(`INSERT INTO refund_number (refund_no, refund_id) SELECT refund_no, id FROM refund ORDER BY id`);
    // Each order's row, as its first coupon writes it: without one, every order is a finding (ORDER_ROW_MISSING).
    await q(
      `INSERT INTO coupon_order (order_no, order_amount_cents, refunded, created_at)
       SELECT x.order_no, 20000, EXISTS (SELECT 1 FROM refund f WHERE f.order_no = x.order_no), x.created_at
       FROM (SELECT r.order_no, COALESCE(h.created_at, r.used_at) AS created_at
             FROM redemption r LEFT JOIN redemption_hold h ON h.order_no = r.order_no AND h.user_coupon_id = r.user_coupon_id
             UNION ALL SELECT order_no, created_at FROM redemption_hold WHERE status = 'RELEASED') x
       ORDER BY x.order_no`,
    );
    // Faults spread over the whole id range, FAULTS of each kind.
    // Ids spread over the whole range; `offset` picks the status (see the n % 20 pattern above).
    const spread = (offset: number) => Array.from({ length: FAULTS }, (_, i) => 20 * Math.floor(((i + 0.5) * n) / FAULTS / 20) + offset);
    const unused = spread(1);
    const used = spread(13);
    const refunded = spread(16);
    const stockFaults = [...new Set(Array.from({ length: FAULTS }, (_, i) => 1 + Math.floor((i * coupons) / FAULTS)))];
    await q(`UPDATE coupon_stock SET stock = stock - 1 WHERE coupon_id IN (?)`, [stockFaults]);
    await q(`UPDATE user_coupon SET status = 'USED', used_at = UTC_TIMESTAMP(3) WHERE id IN (?)`, [unused]);
    await q(`DELETE FROM redemption WHERE user_coupon_id IN (?)`, [used]);
    await q(`UPDATE coupon_order SET refunded = 0 WHERE order_no IN (?)`, [refunded.map((id) => `o-${id}`)]);
    await q(`DELETE FROM user_coupon_state_log WHERE user_coupon_id IN (?) AND to_status = 'UNUSED'`, [unused.map((id) => id + 1)]);
    for (const t of [
      'coupon',
      'coupon_stock',
      'user_coupon',
      'user_coupon_state_log',
      'redemption',
      'redemption_hold',
      'refund',
      'coupon_order',
    ])
      await q(`ANALYZE TABLE ${t}`);
    await q(`DROP TABLE bench_seq, bench_digit`);
    const count = async (table: string) => Number(((await conn.query(`SELECT COUNT(*) AS c FROM ${table}`))[0] as { c: string }[])[0].c);
    return {
      coupons,
      logRows: await count('user_coupon_state_log'),
      redemptions: await count('redemption'),
      holds: await count('redemption_hold'),
      refunds: await count('refund'),
      injected: stockFaults.length + 4 * FAULTS,
    };
  } finally {
    await conn.end();
  }
}

async function serverQuery<T>(config: AppConfig, sql: string, params: unknown[] = []): Promise<T[]> {
  const conn = await mysql.createConnection({
    host: config.DB_HOST,
    port: config.DB_PORT,
    user: config.DB_USER,
    password: config.DB_PASSWORD,
  });
  try {
    return (await conn.query(sql, params))[0] as T[];
  } finally {
    await conn.end();
  }
}

const poolReads = async (config: AppConfig) =>
  Number((await serverQuery<{ Value: string }>(config, `SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_reads'`))[0].Value);

const AUDITED_TABLES = ['coupon_stock', 'user_coupon', 'user_coupon_state_log', 'redemption', 'redemption_hold', 'refund', 'coupon_order'];

/** Whole disks (not partitions) in /proc/diskstats: sectors read are field 6, written field 10. */
const WHOLE_DISK = /^(?:[shv]d[a-z]+|xvd[a-z]+|nvme\d+n\d+)$/;

async function ioCounters(config: AppConfig): Promise<Omit<RunIo, 'seconds' | 'concurrency'>> {
  let sectorsRead = 0;
  let sectorsWritten = 0;
  for (const line of readFileSync('/proc/diskstats', 'utf8').split('\n')) {
    const f = line.trim().split(/\s+/);
    if (!WHOLE_DISK.test(f[2] ?? '')) continue;
    sectorsRead += Number(f[5]);
    sectorsWritten += Number(f[9]);
  }
  const innodb = Object.fromEntries(
    (
      await serverQuery<{ Variable_name: string; Value: string }>(
        config,
        `SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_data_read', 'Innodb_data_written', 'Innodb_buffer_pool_read_ahead')`,
      )
    ).map((r) => [r.Variable_name, Number(r.Value)]),
  );
  return {
    diskReadMiB: (sectorsRead * 512) / 1048576,
    diskWrittenMiB: (sectorsWritten * 512) / 1048576,
    innodbReadMiB: innodb.Innodb_data_read / 1048576,
    innodbWrittenMiB: innodb.Innodb_data_written / 1048576,
    readAheadMiB: (innodb.Innodb_buffer_pool_read_ahead * 16384) / 1048576,
    purgedUndoPages: await purgedUndoPages(config),
  };
}

const purgedUndoPages = async (config: AppConfig) =>
  Number(
    (
      await serverQuery<{ count: string }>(
        config,
        `SELECT count FROM information_schema.innodb_metrics WHERE name = 'purge_undo_log_pages'`,
      )
    )[0]?.count ?? 0,
  );

/**
 * Waits until purge has processed fewer than PURGE_QUIET_PAGES_PER_S undo pages a second over the
 * last PURGE_QUIET_WINDOW_S, or PURGE_WAIT_MAX_S: the history list cannot tell (it counts
 * transactions, and was empty while purge still visited the load's rows; BENCHMARKS.md).
 */
async function waitForQuietPurge(config: AppConfig): Promise<PurgeWait> {
  const start = performance.now();
  const first = await purgedUndoPages(config);
  const samples = [{ at: start, pages: first }];
  const elapsed = () => (performance.now() - start) / 1000;
  while (elapsed() < PURGE_WAIT_MAX_S) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const now = { at: performance.now(), pages: await purgedUndoPages(config) };
    samples.push(now);
    // The newest sample a whole window old: samples are a little over 1 s apart.
    const from = samples.findLast((x) => now.at - x.at >= PURGE_QUIET_WINDOW_S * 1000);
    if (!from) continue;
    const rate = ((now.pages - from.pages) * 1000) / (now.at - from.at);
    if (samples.length % 10 === 0)
      console.error(`reconcile bench: purge at ${rate.toFixed(1)} undo pages/s after ${elapsed().toFixed(0)} s`);
    if (rate < PURGE_QUIET_PAGES_PER_S) return { seconds: round(elapsed()), undoPagesPurged: now.pages - first, quiet: true };
  }
  return { seconds: round(elapsed()), undoPagesPurged: (await purgedUndoPages(config)) - first, quiet: false };
}

/** A full run measured with the disk's and InnoDB's reads and writes during it. */
async function timedRun(config: AppConfig, app: INestApplication, runs: RunIo[]) {
  const before = await ioCounters(config);
  const run = await measured(() => app.get(ReconciliationService).runNow('FULL', 'bench'));
  const after = await ioCounters(config);
  const during = Object.fromEntries(
    Object.entries(after).map(([k, v]) => [k, Math.round(v - before[k as keyof typeof before])]),
  ) as typeof after;
  runs.push({ seconds: round(run.seconds), concurrency: app.get(AppConfig).RECONCILE_CONCURRENCY, ...during });
  return run;
}

async function tablesMiB(config: AppConfig): Promise<number> {
  const [row] = await serverQuery<{ bytes: string }>(
    config,
    `SELECT SUM(data_length + index_length) AS bytes FROM information_schema.tables WHERE table_schema = ? AND table_name IN (?)`,
    [config.DB_NAME, AUDITED_TABLES],
  );
  return MiB(Number(row.bytes));
}

/**
 * Samples RSS and heap while `fn` runs; memory is what the run holds, whatever the table size.
 * Heap in use peaks with garbage not yet collected, so the heap right after each full collection
 * (observed through perf_hooks' gc entries) is taken too: that is what the run keeps alive.
 */
async function measured<T>(
  fn: () => Promise<T>,
): Promise<{ value: T; seconds: number; peakRss: number; peakHeap: number; peakLiveHeap: number | null }> {
  let peakRss = process.memoryUsage.rss();
  let peakHeap = process.memoryUsage().heapUsed;
  let peakLiveHeap: number | null = null;
  const timer = setInterval(() => {
    peakRss = Math.max(peakRss, process.memoryUsage.rss());
    peakHeap = Math.max(peakHeap, process.memoryUsage().heapUsed);
  }, 20);
  const gcs = new PerformanceObserver((list) => {
    for (const e of list.getEntries())
      if ((e as unknown as { detail?: { kind?: number } }).detail?.kind === perfConstants.NODE_PERFORMANCE_GC_MAJOR)
        peakLiveHeap = Math.max(peakLiveHeap ?? 0, process.memoryUsage().heapUsed);
  });
  gcs.observe({ entryTypes: ['gc'] });
  const start = process.hrtime.bigint();
  try {
    const value = await fn();
    return { value, seconds: Number(process.hrtime.bigint() - start) / 1e9, peakRss, peakHeap, peakLiveHeap };
  } finally {
    clearInterval(timer);
    gcs.disconnect();
  }
}

async function child(n: number): Promise<SizeResult> {
  const config = benchConfig();
  await dropTestDatabase(config);
  await ensureDatabase(config);
  await migrate(config);
  const gen = await measured(() => generate(config, n));
  const app = await createApp(config);
  await app.init();
  try {
    const service = app.get(ReconciliationService);
    global.gc?.();
    const rssBefore = process.memoryUsage.rss();
    const runs: RunIo[] = [];
    const first = await timedRun(config, app, runs);
    if (first.value.status !== 'COMPLETED') throw new Error(`run failed: ${first.value.error}`);
    if (first.value.discrepancies !== gen.value.injected)
      throw new Error(`found ${first.value.discrepancies} discrepancies, injected ${gen.value.injected}`);
    const purgeWait = await waitForQuietPurge(config);
    // Its findings are still open, so the next runs do the same reading and record nothing new.
    // The fastest of SETTLED_RUNS is the cost least disturbed by whatever else the machine runs.
    const loadAverageAtRun = round(os.loadavg()[0]);
    const readsBefore = await poolReads(config);
    const settled: (Awaited<ReturnType<typeof measured<RunView>>> & { concurrency: number })[] = [];
    const appConfig = app.get(AppConfig);
    for (let i = 0; i < SETTLED_RUNS; i++) {
      for (const concurrency of i % 2 === 0 ? CONCURRENCY : [...CONCURRENCY].reverse()) {
        appConfig.RECONCILE_CONCURRENCY = concurrency;
        settled.push({ ...(await timedRun(config, app, runs)), concurrency });
      }
    }
    const fastest = (runs: typeof settled) => runs.reduce((a, b) => (b.seconds < a.seconds ? b : a));
    const fullRunSecondsByConcurrency = Object.fromEntries(
      CONCURRENCY.map((c) => [String(c), round(fastest(settled.filter((r) => r.concurrency === c)).seconds)]),
    );
    appConfig.RECONCILE_CONCURRENCY = config.RECONCILE_CONCURRENCY;
    const bufferPoolReadsDuringRun = Math.round(((await poolReads(config)) - readsBefore) / settled.length);
    const bad = settled.find((r) => r.value.status !== 'COMPLETED' || r.value.discrepancies !== 0);
    if (bad) throw new Error(`settled run: ${JSON.stringify(bad.value)}`);
    const full = fastest(settled.filter((r) => r.concurrency === config.RECONCILE_CONCURRENCY));
    const inc = await measured(() => service.runNow('INCREMENTAL', 'bench'));
    return {
      userCoupons: n,
      coupons: gen.value.coupons,
      logRows: gen.value.logRows,
      redemptions: gen.value.redemptions,
      holds: gen.value.holds,
      refunds: gen.value.refunds,
      generateSeconds: round(gen.seconds),
      firstFullRunSeconds: round(first.seconds),
      fullRunSeconds: round(full.seconds),
      settledRunSeconds: settled.map((r) => round(r.seconds)),
      fullRunSecondsByConcurrency,
      incrementalRunSeconds: round(inc.seconds),
      checked: full.value.checked,
      discrepanciesFound: first.value.discrepancies,
      discrepanciesInjected: gen.value.injected,
      rssBeforeRunMiB: MiB(rssBefore),
      peakRssDuringRunMiB: MiB(Math.max(first.peakRss, ...settled.map((r) => r.peakRss))),
      peakHeapUsedDuringRunMiB: MiB(Math.max(first.peakHeap, ...settled.map((r) => r.peakHeap))),
      peakHeapAfterFullGcMiB: afterGc(first, ...settled),
      processMaxRssMiB: MiB(process.resourceUsage().maxRSS * 1024),
      microsecondsPerUserCoupon: round((full.seconds * 1e6) / n),
      bufferPoolReadsDuringRun,
      tablesMiB: await tablesMiB(config),
      loadAverageAtRun,
      runs,
      purgeWait,
    };
  } finally {
    await app.close();
    if (!opt['keep-db']) await dropTestDatabase(config);
  }
}

const round = (x: number) => Math.round(x * 100) / 100;

function runChild(n: number): Promise<SizeResult> {
  return new Promise((resolve, reject) => {
    const p = spawn(
      process.execPath,
      [
        '--expose-gc',
        fileURLToPath(import.meta.url),
        '--child',
        String(n),
        '--concurrency',
        CONCURRENCY.join(','),
        '--settled-runs',
        String(SETTLED_RUNS),
        '--purge-wait-max-s',
        String(PURGE_WAIT_MAX_S),
        ...(opt['keep-db'] ? ['--keep-db'] : []),
      ],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    let out = '';
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.on('exit', (code) => {
      const line = out.trim().split('\n').at(-1) ?? '';
      if (code === 0 && line.startsWith('{')) resolve(JSON.parse(line) as SizeResult);
      else reject(new Error(`size ${n}: child exited ${code}\n${out}`));
    });
  });
}

async function parent(): Promise<void> {
  const sizes = (opt.sizes ?? '').split(',').map((s) => Number.parseInt(s, 10));
  if (sizes.length === 0 || !sizes.every((s) => Number.isInteger(s) && s >= 100 && s <= 10_000_000)) {
    console.error('--sizes takes a comma-separated list of user coupon counts (100 to 10,000,000)');
    process.exit(2);
  }
  const poolMiB = opt['buffer-pool-mib'] === undefined ? undefined : Number(opt['buffer-pool-mib']);
  if (poolMiB !== undefined && !(Number.isInteger(poolMiB) && poolMiB >= 128)) {
    console.error('--buffer-pool-mib takes a whole number of MiB, 128 or more');
    process.exit(2);
  }
  if (!(PURGE_WAIT_MAX_S === 0 || PURGE_WAIT_MAX_S >= PURGE_QUIET_WINDOW_S)) {
    console.error(`--purge-wait-max-s takes a whole number of seconds: 0 (no wait), or ${PURGE_QUIET_WINDOW_S} or more`);
    process.exit(2);
  }
  const [{ bufferPool: poolBefore }] = await serverQuery<{ bufferPool: string }>(
    benchConfig(),
    `SELECT @@innodb_buffer_pool_size AS bufferPool`,
  );
  const [{ off: purgeMetricsOff }] = await serverQuery<{ off: number }>(
    benchConfig(),
    `SELECT COUNT(*) AS off FROM information_schema.innodb_metrics WHERE name = 'purge_undo_log_pages' AND enabled = 0`,
  );
  /** The server's settings as they were: the buffer pool, and the purge counters' collection. */
  const restoreServer = async () => {
    try {
      if (Number(purgeMetricsOff)) await serverQuery(benchConfig(), `SET GLOBAL innodb_monitor_disable = 'module_purge'`);
      if (poolMiB !== undefined) await setPool(Number(poolBefore));
    } catch (err) {
      console.error(`could not set the server back (innodb_buffer_pool_size ${poolBefore}, purge metrics): ${String(err)}`);
    }
  };
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => void restoreServer().finally(() => process.exit(130)));
  const results: SizeResult[] = [];
  let server: { version: string; bufferPool: string };
  try {
    if (poolMiB !== undefined) await setPool(poolMiB * 1048576);
    await serverQuery(benchConfig(), `SET GLOBAL innodb_monitor_enable = 'module_purge'`);
    [server] = await serverQuery<{ version: string; bufferPool: string }>(
      benchConfig(),
      `SELECT VERSION() AS version, @@innodb_buffer_pool_size AS bufferPool`,
    );
    for (const n of sizes) {
      console.error(`reconcile bench: generating and auditing ${n.toLocaleString('en')} user coupons...`);
      results.push(await runChild(n));
      console.error(JSON.stringify(results.at(-1)));
    }
  } finally {
    await restoreServer();
  }
  const base = results[0];
  const growth = results.map((r) => ({
    userCoupons: r.userCoupons,
    sizeRatio: round(r.userCoupons / base.userCoupons),
    durationRatio: round(r.fullRunSeconds / base.fullRunSeconds),
  }));
  const machine = {
    cpus: `${os.cpus().length} x ${os.cpus()[0]?.model ?? 'unknown'}`,
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    database: `${server.version}, innodb_buffer_pool_size ${MiB(Number(server.bufferPool))} MiB`,
    commit: gitCommit(),
    date: new Date().toISOString(),
  };
  const report = { benchmark: 'reconciliation full run', machine, results, growth };
  mkdirSync(opt.out as string, { recursive: true });
  writeFileSync(`${opt.out}/reconcile.json`, JSON.stringify(report, null, 2) + '\n');
  writeFileSync(`${opt.out}/reconcile.md`, toMarkdown(report));
  console.log(toMarkdown(report));
}

/** Sets InnoDB's buffer pool and waits for the resize, which the server does in the background. */
async function setPool(bytes: number): Promise<void> {
  await serverQuery(benchConfig(), `SET GLOBAL innodb_buffer_pool_size = ?`, [bytes]);
  const until = Date.now() + 5 * 60_000;
  for (;;) {
    const [{ Value: status }] = await serverQuery<{ Value: string }>(
      benchConfig(),
      `SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_resize_status'`,
    );
    if (status === '' || /^Completed/i.test(status)) return;
    if (Date.now() > until) throw new Error(`buffer pool resize not done after 5 minutes: ${status}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** HEAD, marked -dirty when the tree has changes: the run was of code no commit holds. */
function gitCommit(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    return execFileSync('git', ['status', '--porcelain'], { encoding: 'utf8' }).trim() === '' ? head : `${head}-dirty`;
  } catch {
    return 'unknown';
  }
}

function toMarkdown(r: {
  machine: Record<string, string | number>;
  results: SizeResult[];
  growth: { userCoupons: number; sizeRatio: number; durationRatio: number }[];
}): string {
  const row = (cells: (string | number)[]) => `| ${cells.join(' | ')} |`;
  return [
    '# Reconciliation benchmark',
    '',
    `Machine: ${r.machine.cpus}, ${r.machine.memoryGiB} GiB; Node ${r.machine.node}; ${r.machine.database}; commit ${r.machine.commit}; ${r.machine.date}.`,
    '',
    row([
      'user coupons',
      'coupons',
      'log rows',
      'redemptions',
      'holds',
      'refunds',
      'full run (s)',
      'µs per user coupon',
      `full run by RECONCILE_CONCURRENCY ${CONCURRENCY.join(' / ')} (s)`,
      'first full run after load (s)',
      'incremental run (s)',
      'peak RSS during runs (MiB)',
      'RSS before (MiB)',
      'peak heap (MiB)',
      'peak heap after a full GC (MiB)',
      'found / injected',
      'tables (MiB)',
      'buffer pool reads in run',
      'load average',
    ]),
    row(Array(19).fill('---')),
    ...r.results.map((x) =>
      row([
        x.userCoupons.toLocaleString('en'),
        x.coupons.toLocaleString('en'),
        x.logRows.toLocaleString('en'),
        x.redemptions.toLocaleString('en'),
        x.holds.toLocaleString('en'),
        x.refunds.toLocaleString('en'),
        x.fullRunSeconds,
        x.microsecondsPerUserCoupon,
        CONCURRENCY.map((c) => x.fullRunSecondsByConcurrency[String(c)]).join(' / '),
        x.firstFullRunSeconds,
        x.incrementalRunSeconds,
        x.peakRssDuringRunMiB,
        x.rssBeforeRunMiB,
        x.peakHeapUsedDuringRunMiB,
        x.peakHeapAfterFullGcMiB ?? 'no full GC',
        `${x.discrepanciesFound} / ${x.discrepanciesInjected}`,
        x.tablesMiB,
        x.bufferPoolReadsDuringRun,
        x.loadAverageAtRun,
      ]),
    ),
    '',
    'Each full run in order (the first one right after the bulk load), with what the disk (every process) and InnoDB read and wrote during it:',
    '',
    row([
      'user coupons',
      'run',
      'RECONCILE_CONCURRENCY',
      'seconds',
      'disk read (MiB)',
      'disk written (MiB)',
      'InnoDB read (MiB)',
      'InnoDB written (MiB)',
      'of which read ahead (MiB)',
      'undo pages purged',
    ]),
    row(Array(10).fill('---')),
    ...r.results.flatMap((x) =>
      x.runs.map((run, i) =>
        row([
          x.userCoupons.toLocaleString('en'),
          i === 0 ? 'first' : i,
          run.concurrency,
          run.seconds,
          run.diskReadMiB,
          run.diskWrittenMiB,
          run.innodbReadMiB,
          run.innodbWrittenMiB,
          run.readAheadMiB,
          run.purgedUndoPages,
        ]),
      ),
    ),
    '',
    ...r.results.map(
      (x) =>
        `${x.userCoupons.toLocaleString('en')}: ${
          PURGE_WAIT_MAX_S === 0
            ? "no wait for InnoDB's purge between the first run and the settled ones (--purge-wait-max-s 0)"
            : `between the first run and the settled ones, ${x.purgeWait.seconds} s waiting for InnoDB's purge to go quiet (under ${PURGE_QUIET_PAGES_PER_S} undo pages a second over ${PURGE_QUIET_WINDOW_S} s), ${x.purgeWait.undoPagesPurged.toLocaleString('en')} undo pages purged meanwhile; ${x.purgeWait.quiet ? 'quiet' : `not quiet after --purge-wait-max-s ${PURGE_WAIT_MAX_S}`}`
        }.`,
    ),
    '',
    `Growth of the full run against the first size: ${r.growth
      .slice(1)
      .map((g) => `${g.sizeRatio}x the user coupons took ${g.durationRatio}x the time`)
      .join('; ')}.`,
    '',
    `Full run: the fastest of ${SETTLED_RUNS} full runs at the configured RECONCILE_CONCURRENCY on the settled database (a nightly run); each --concurrency value got ${SETTLED_RUNS} runs too, alternating with the others; the fastest is the least disturbed by other work on the machine (load average column). The first run starts right after the bulk load; the runs in the minutes after a load read more pages than later ones while InnoDB's purge works through the load (undo pages purged, in the I/O table; BENCHMARKS.md).`,
    'Peak RSS is the whole benchmark process: the Nest app, its pools, and the run. Peak heap counts garbage not yet collected; the heap right after a full GC is what the run keeps alive.',
    '',
  ].join('\n');
}

if (opt.child) {
  child(Number.parseInt(opt.child, 10)).then(
    (r) => {
      console.log(JSON.stringify(r));
      process.exit(0);
    },
    (err: unknown) => {
      console.error(err);
      process.exit(1);
    },
  );
} else {
  parent().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
