// npm run bench:db [-- --grabs 10000 --stock 5000 --in-flight 1000 --rounds 3]
// The database side of the grab alone (issue 22): grabs submitted in-process to GrabService, no
// HTTP, no JWT, no rate limiter, so the figure is what the hot coupon's row and the transactions
// around it can take. The grouped strategy against one transaction per grab (per-request), in
// alternating order, each in a fresh database; every run checked: sold out exactly, one coupon per
// user, the invariants of API.md. Results go to stdout as markdown.
import { randomBytes } from 'node:crypto';
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { DataSource } from 'typeorm';
import { createApp } from '../src/app.factory.js';
import { AppError } from '../src/common/errors.js';
import { type AppConfig, loadConfig } from '../src/config/app-config.js';
import { CouponService } from '../src/coupon/coupon.service.js';
import { GrabService } from '../src/coupon/grab.service.js';
import { prepareDatabase } from '../src/database/bootstrap-database.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { couponBody } from '../test/support/coupon-body.js';
import { dbEnv, dropDatabase } from './flash-sale/run-design.js';
import { latency } from './flash-sale/stats.js';

const { values: opt } = parseArgs({
  options: {
    grabs: { type: 'string', default: '10000' },
    stock: { type: 'string', default: '5000' },
    'in-flight': { type: 'string', default: '1000' },
    rounds: { type: 'string', default: '3' },
  },
});
const GRABS = Number(opt.grabs);
const STOCK = Number(opt.stock);
const IN_FLIGHT = Number(opt['in-flight']);
const ROUNDS = Number(opt.rounds);
const STRATEGIES = ['grouped', 'per-request'] as const;
type Strategy = (typeof STRATEGIES)[number];

interface Run {
  round: number;
  strategy: Strategy;
  perSecond: number;
  issuedPerSecond: number;
  successP99Ms: number;
  cpuMsPerGrab: number;
  counts: Record<string, number>;
  violations: string[];
}

/** At most `inFlight` grabs at once, as `inFlight` shoppers each pressing again once answered. */
async function submit(
  grab: (i: number) => Promise<unknown>,
  n: number,
  inFlight: number,
): Promise<{ code: string; ms: number; at: number }[]> {
  const results: { code: string; ms: number; at: number }[] = new Array(n);
  const t0 = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(inFlight, n) }, async () => {
      while (next < n) {
        const i = next++;
        const started = performance.now();
        let code = 'ISSUED';
        try {
          await grab(i);
        } catch (err) {
          code = err instanceof AppError ? err.code : `ERROR ${(err as Error).message}`;
        }
        const end = performance.now();
        results[i] = { code, ms: end - started, at: end - t0 };
      }
    }),
  );
  return results;
}

async function runOnce(round: number, strategy: Strategy): Promise<Run> {
  const database = `ce_bench_db_${randomBytes(4).toString('hex')}`;
  const config: AppConfig = loadConfig({
    ...dbEnv(),
    DB_NAME: database,
    JWT_SECRET: randomBytes(24).toString('hex'),
    LOG_LEVEL: 'warn',
    GRAB_STRATEGY: strategy,
    RATE_LIMIT_ENABLED: 'false',
    SCHEDULER_ENABLED: 'false',
    WEBHOOK_RELAY_ENABLED: 'false',
    BULK_RUNNER_ENABLED: 'false',
  });
  await prepareDatabase(config);
  const app = await createApp(config);
  await app.init();
  try {
    const coupons = app.get(CouponService);
    const grabs = app.get(GrabService);
    const key = (prefix: string, i: number) => `${prefix}-${round}-${i}`;
    // Warm-up on a coupon of its own: JIT, pool, statement paths.
    const { coupon: warm } = await coupons.create(couponBody({ name: 'warm-up', totalStock: 500 }));
    await submit((i) => grabs.grab(`warm-${i}`, warm.id, key('w', i)), 1000, IN_FLIGHT);

    const { coupon } = await coupons.create(couponBody({ name: 'db-side bench', totalStock: STOCK }));
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const answers = await submit((i) => grabs.grab(`user-${i}`, coupon.id, key('g', i)), GRABS, IN_FLIGHT);
    const wallMs = performance.now() - t0;
    const cpu = process.cpuUsage(cpu0);

    const counts: Record<string, number> = {};
    for (const a of answers) counts[a.code] = (counts[a.code] ?? 0) + 1;
    const issued = answers.filter((a) => a.code === 'ISSUED');
    const lastIssuedAt = Math.max(...issued.map((a) => a.at));
    const db = app.get(DataSource);
    const violations = await checkInvariants(db, { couponIds: [coupon.id] });
    const [row] = (await db.query(
      `SELECT (SELECT stock FROM coupon_stock WHERE coupon_id = ?) AS stock,
              COUNT(*) AS coupons, COUNT(DISTINCT user_id) AS users FROM user_coupon WHERE coupon_id = ?`,
      [coupon.id, coupon.id],
    )) as { stock: string; coupons: string; users: string }[];
    const expectIssued = Math.min(STOCK, GRABS);
    if (Number(row.coupons) !== expectIssued || issued.length !== expectIssued) {
      violations.push(`issued ${row.coupons} rows / ${issued.length} answers, expected ${expectIssued}`);
    }
    if (Number(row.users) !== Number(row.coupons)) violations.push(`${row.coupons} coupons for ${row.users} users`);
    if (Number(row.stock) !== STOCK - expectIssued) violations.push(`stock left ${row.stock}, expected ${STOCK - expectIssued}`);
    const unexpected = Object.keys(counts).filter((c) => c !== 'ISSUED' && c !== 'SOLD_OUT');
    if (unexpected.length > 0) violations.push(`unexpected answers: ${unexpected.map((c) => `${c} x${counts[c]}`).join(', ')}`);
    return {
      round,
      strategy,
      perSecond: (GRABS / wallMs) * 1000,
      issuedPerSecond: (issued.length / lastIssuedAt) * 1000,
      successP99Ms: latency(issued.map((a) => a.ms))?.p99 ?? NaN,
      cpuMsPerGrab: (cpu.user + cpu.system) / 1000 / GRABS,
      counts,
      violations,
    };
  } finally {
    await app.close();
    await dropDatabase(database);
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmt = (x: number, digits = 0) => x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

async function main(): Promise<void> {
  const load0 = loadavg()[0];
  const runs: Run[] = [];
  const warmUp: Run[] = [];
  // Round 0 warms the process up and is checked but not reported: every round runs in this one process, and
  // the per-run warm-up of 1,000 grabs left the first round's grouped grab at about twice the CPU per grab of the
  // later ones (JIT), which skewed the first same-round ratio.
  for (let round = 0; round <= ROUNDS; round++) {
    // Alternating order, so neither strategy always runs on the warmer (or busier) machine.
    const order = round % 2 === 1 ? STRATEGIES : [...STRATEGIES].reverse();
    for (const strategy of order) {
      const r = await runOnce(round, strategy);
      (round === 0 ? warmUp : runs).push(r);
      console.error(
        `${round === 0 ? 'warm-up round' : `round ${round}`} ${strategy}: ${fmt(r.perSecond)} grabs/s, CPU ${fmt(r.cpuMsPerGrab, 3)} ms per grab, ${r.violations.length} violations`,
      );
    }
  }
  console.log(
    `Command: \`npm run bench:db -- --grabs ${GRABS} --stock ${STOCK} --in-flight ${IN_FLIGHT} --rounds ${ROUNDS}\` · ${new Date().toISOString()} · load average ${load0.toFixed(2)} at start, ${loadavg()[0].toFixed(2)} at end\n`,
  );
  console.log(
    '| round | strategy | grabs decided/s | issued/s (until sold out) | success p99, ms | CPU of this process per grab, ms | answers | checks |',
  );
  console.log('|---|---|---|---|---|---|---|---|');
  for (const r of runs) {
    const answers = Object.entries(r.counts)
      .map(([c, n]) => `${c} ${fmt(n)}`)
      .join(', ');
    console.log(
      `| ${r.round} | ${r.strategy} | ${fmt(r.perSecond)} | ${fmt(r.issuedPerSecond)} | ${fmt(r.successP99Ms, 1)} | ${fmt(r.cpuMsPerGrab, 3)} | ${answers} | ${r.violations.length === 0 ? 'pass' : r.violations.join('; ')} |`,
    );
  }
  const ratios = Array.from({ length: ROUNDS }, (_, i) => {
    const of = (s: Strategy) => runs.find((r) => r.round === i + 1 && r.strategy === s) as Run;
    return {
      decided: of('grouped').perSecond / of('per-request').perSecond,
      issued: of('grouped').issuedPerSecond / of('per-request').issuedPerSecond,
    };
  });
  console.log(
    `\nGrouped ÷ one transaction per grab, same round: decided ${ratios.map((r) => `${fmt(r.decided, 2)}×`).join(', ')} (median ${fmt(median(ratios.map((r) => r.decided)), 2)}×); issued ${ratios.map((r) => `${fmt(r.issued, 2)}×`).join(', ')} (median ${fmt(median(ratios.map((r) => r.issued)), 2)}×).`,
  );
  for (const r of warmUp.filter((w) => w.violations.length > 0)) console.log(`\nWarm-up round, ${r.strategy}: ${r.violations.join('; ')}`);
  if ([...warmUp, ...runs].some((r) => r.violations.length > 0)) process.exitCode = 1;
}

await main();
