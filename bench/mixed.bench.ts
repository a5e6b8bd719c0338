// npm run bench:mixed [-- --units 500 --connections 400 --rounds 3 --quick]
// A sale's mixed load (issue 22): coupon page reads, grabs, "my coupons", checkout holds and
// confirmations at 20 : 5 : 2 : 1 : 1, interleaved at random over the same connections, beside the
// no-op route of the same stack in the same server process and round. Per route: throughput, p50
// and p99, and the server's CPU per request of the whole mix. Every answer is checked against what
// that route may answer, and the database afterwards (grabs sold out exactly, every hold confirmed,
// the invariants of API.md).
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { DataSource } from 'typeorm';
import { signToken } from '../src/auth/jwt.js';
import { loadConfig } from '../src/config/app-config.js';
import { dataSourceOptions } from '../src/database/data-source-options.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { updateBenchmarksMd } from './benchmarks-md.js';
import { LoadGenerator, type Answer, type Shot } from './flash-sale/load.js';
import { createCoupon, dbEnv, dropDatabase, quietServerEnv } from './flash-sale/run-design.js';
import { saleWinners, userToken } from './flash-sale/sale.js';
import { startServer, type RunningServer } from './flash-sale/server.js';
import { answerClass, latency, type Latency } from './flash-sale/stats.js';

const { values: opt } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    units: { type: 'string' },
    connections: { type: 'string' },
    rounds: { type: 'string' },
  },
});
const quick = opt.quick === true;
const intOpt = (v: string | undefined, full: number, small: number) => (v === undefined ? (quick ? small : full) : Number.parseInt(v, 10));
/** One unit is 29 requests: 20 page reads, 5 grabs, 2 "my coupons", 1 hold, 1 confirmation. */
const UNITS = intOpt(opt.units, 500, 60);
const CONNECTIONS = intOpt(opt.connections, 400, 100);
const ROUNDS = intOpt(opt.rounds, 3, 1);
if (![UNITS, CONNECTIONS, ROUNDS].every((n) => Number.isInteger(n) && n > 0)) {
  console.error('--units, --connections and --rounds take positive integers');
  process.exit(2);
}

const MIX = { page: 20, grab: 5, mine: 2, hold: 1, confirm: 1 } as const;
type Kind = keyof typeof MIX;
const KINDS = Object.keys(MIX) as Kind[];
/** What each route may answer in this sale; anything else (a 5xx, a transport error) fails the run. */
const ALLOWED: Record<Kind, string[]> = {
  page: ['SUCCESS'],
  grab: ['SUCCESS', 'SOLD_OUT'],
  mine: ['SUCCESS'],
  hold: ['SUCCESS'],
  confirm: ['SUCCESS'],
};
/** Over couponBody's 10,000-cent threshold. */
const ORDER_CENTS = 20_000;
const JWT_SECRET = randomBytes(24).toString('hex');
const admin = `Bearer ${signToken(JWT_SECRET, 'bench-admin', ['admin'], 4 * 3600)}`;
const orders = `Bearer ${signToken(JWT_SECRET, 'bench-orders', ['service'], 4 * 3600)}`;

interface Measured {
  wallMs: number;
  perSecond: number;
  serverCpuMsPerRequest: number;
  latency: Latency;
}
interface RoundResult {
  round: number;
  loadAverage: [number, number];
  mixed: Measured & { byKind: Record<Kind, { n: number; perSecond: number; latency: Latency }> };
  noop: Measured;
  violations: string[];
}

const r1 = (x: number) => Math.round(x * 10) / 10;
const loadAvg = () => r1(os.loadavg()[0]);

/** A small deterministic generator, so every round interleaves the routes the same way. */
function shuffle<T>(xs: T[], seed: number): T[] {
  let s = seed >>> 0;
  const next = () => (s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32;
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [xs[i], xs[j]] = [xs[j], xs[i]];
  }
  return xs;
}

async function measure(
  server: RunningServer,
  load: LoadGenerator,
  path: string,
  shots: Shot[],
): Promise<{ m: Measured; answers: Answer[] }> {
  const cpu0 = server.cpuSeconds();
  const res = await load.fire(path, shots);
  const cpuMs = (server.cpuSeconds() - cpu0) * 1000;
  return {
    m: {
      wallMs: r1(res.wallMs),
      perSecond: r1((shots.length / res.wallMs) * 1000),
      serverCpuMsPerRequest: Math.round((cpuMs / shots.length) * 1000) / 1000,
      latency: latency(res.answers.map((a) => a.latencyMs)) as Latency,
    },
    answers: res.answers,
  };
}

async function round(server: RunningServer, load: LoadGenerator, db: DataSource, n: number, label: string): Promise<RoundResult> {
  const atStart = loadAvg();
  const auth = { admin, jwtSecret: JWT_SECRET };
  // Before the timed part: the shoppers who check out won their coupons earlier in the sale, and
  // those who confirm now placed their order (a hold) a moment ago.
  const checkout = await saleWinners(server.url, load, auth, `${label}-c`, n * (MIX.hold + MIX.confirm));
  const holding = checkout.slice(0, n * MIX.confirm);
  const toHold = checkout.slice(n * MIX.confirm);
  const holdShot = (w: (typeof checkout)[number], path: string): Shot => ({
    userId: w.userId,
    authorization: orders,
    path,
    body: JSON.stringify({ userCouponId: w.userCouponId, orderNo: w.orderNo, userId: w.userId, orderAmountCents: ORDER_CENTS }),
  });
  const held = await load.fire(
    '/redemptions/holds',
    holding.map((w) => holdShot(w, '/redemptions/holds')),
  );
  if (held.answers.some((a) => a.status !== 201)) throw new Error(`${label}: a hold before the timed part was refused`);
  // The hot coupon: half the grabs win, the rest are told it sold out.
  const grabs = n * MIX.grab;
  const stock = Math.floor(grabs / 2);
  const hot = await createCoupon(server.url, admin, stock);

  const shots: Shot[] = [];
  const kinds: Kind[] = [];
  const add = (kind: Kind, shot: Shot) => {
    shots.push(shot);
    kinds.push(kind);
  };
  for (let i = 0; i < n * MIX.page; i++) add('page', { userId: '', authorization: '', method: 'GET', path: `/coupons/${hot}` });
  for (let i = 0; i < grabs; i++) {
    const userId = `${label}-g${i}`;
    add('grab', { userId, key: `${label}-gk${i}`, authorization: userToken(JWT_SECRET, userId), path: `/coupons/${hot}/grab` });
  }
  for (let i = 0; i < n * MIX.mine; i++) {
    const w = checkout[i % checkout.length];
    add('mine', { userId: w.userId, authorization: w.authorization, method: 'GET', path: '/me/coupons?limit=20' });
  }
  for (const w of toHold) add('hold', holdShot(w, '/redemptions/holds'));
  for (const w of holding) add('confirm', holdShot(w, '/redemptions'));
  const order = shuffle(
    shots.map((_, i) => i),
    n,
  );
  const mixedShots = order.map((i) => shots[i]);
  const mixedKinds = order.map((i) => kinds[i]);

  const mixed = await measure(server, load, '/', mixedShots);
  const noopShots: Shot[] = mixedShots.map((_, i) => ({ userId: `noop-${i}`, authorization: orders }));
  const noop = await measure(server, load, '/noop', noopShots);

  const violations: string[] = [];
  const byKind = {} as RoundResult['mixed']['byKind'];
  for (const kind of KINDS) {
    const mine = mixed.answers.filter((a) => mixedKinds[a.shot] === kind);
    byKind[kind] = {
      n: mine.length,
      perSecond: r1((mine.length / mixed.m.wallMs) * 1000),
      latency: latency(mine.map((a) => a.latencyMs)) as Latency,
    };
    const wrong = new Map<string, number>();
    for (const a of mine) if (!ALLOWED[kind].includes(answerClass(a))) wrong.set(answerClass(a), (wrong.get(answerClass(a)) ?? 0) + 1);
    for (const [cls, count] of wrong) violations.push(`${kind}: ${count} answered ${cls}`);
  }
  const won = mixed.answers.filter((a) => mixedKinds[a.shot] === 'grab' && a.status === 201).length;
  if (won !== stock) violations.push(`grabs: ${won} won, stock was ${stock}`);
  const [row] = (await db.query(
    `SELECT (SELECT stock FROM coupon_stock WHERE coupon_id = ?) AS stockLeft,
            (SELECT COUNT(*) FROM user_coupon WHERE coupon_id = ?) AS issued,
            (SELECT COUNT(*) FROM redemption_hold WHERE status = 'ACTIVE' AND order_no LIKE ?) AS activeHolds`,
    [hot, hot, `${label}-%`],
  )) as { stockLeft: string; issued: string; activeHolds: string }[];
  if (Number(row.stockLeft) !== 0 || Number(row.issued) !== stock)
    violations.push(`hot coupon: ${row.issued} issued, ${row.stockLeft} left`);
  // The holds made in the timed part stay ACTIVE (their orders are not paid in this run).
  if (Number(row.activeHolds) !== toHold.length) violations.push(`${row.activeHolds} active holds, expected ${toHold.length}`);
  violations.push(...(await checkInvariants(db)));
  return {
    round: 0,
    loadAverage: [atStart, loadAvg()],
    mixed: { ...mixed.m, byKind },
    noop: noop.m,
    violations,
  };
}

function toMarkdown(command: string, rounds: RoundResult[]): string {
  const ms = (x: number) => x.toFixed(1);
  const lines = [
    "## A sale's mixed load (issue 22)",
    '',
    `Command: \`${command}\` · ${new Date().toISOString()} · ${os.cpus().length} × ${os.cpus()[0]?.model.trim() ?? 'unknown'}, Node ${process.version} · ${CONNECTIONS} connections, ${UNITS} units of 29 requests (page : grab : my coupons : hold : confirm = 20 : 5 : 2 : 1 : 1), interleaved at random; the no-op route gets as many requests on the same connections right after, in the same server process.`,
    '',
    '| round | load avg | mixed req/s | no-op req/s | mixed ÷ no-op | server CPU per request, mixed / no-op (ms) | p99 mixed / no-op (ms) | checks |',
    '|---|---|---|---|---|---|---|---|',
    ...rounds.map(
      (r) =>
        `| ${r.round} | ${r.loadAverage.join(' → ')} | ${r.mixed.perSecond} | ${r.noop.perSecond} | ${(r.mixed.perSecond / r.noop.perSecond).toFixed(2)} | ${r.mixed.serverCpuMsPerRequest} / ${r.noop.serverCpuMsPerRequest} | ${ms(r.mixed.latency.p99)} / ${ms(r.noop.latency.p99)} | ${r.violations.length === 0 ? 'pass' : r.violations.slice(0, 3).join('; ')} |`,
    ),
    '',
    '| round | route | requests | req/s (its share of the mix) | p50 / p99 (ms) | p99 ÷ no-op p99 |',
    '|---|---|---|---|---|---|',
    ...rounds.flatMap((r) =>
      KINDS.map((k) => {
        const x = r.mixed.byKind[k];
        return `| ${r.round} | ${k} | ${x.n} | ${x.perSecond} | ${ms(x.latency.p50)} / ${ms(x.latency.p99)} | ${(x.latency.p99 / r.noop.latency.p99).toFixed(2)} |`;
      }),
    ),
  ];
  return lines.join('\n');
}

async function main(): Promise<void> {
  const database = `ce_bench_mixed_${process.pid}`;
  const server = await startServer({
    entry: 'dist/bench/reference-server.js',
    env: { ...quietServerEnv(database, JWT_SECRET), WEBHOOK_RELAY_ENABLED: 'false' },
  });
  const load = new LoadGenerator(server.url, CONNECTIONS);
  const db = new DataSource({ ...dataSourceOptions(loadConfig({ ...dbEnv(), DB_NAME: database })), poolSize: 2 });
  const rounds: RoundResult[] = [];
  try {
    await db.initialize();
    console.log(`mixed bench: ${UNITS} units, ${CONNECTIONS} connections, ${ROUNDS} rounds; warm-up...`);
    await round(server, load, db, Math.max(10, Math.floor(UNITS / 5)), 'warm');
    for (let i = 1; i <= ROUNDS; i++) {
      const r = { ...(await round(server, load, db, UNITS, `r${i}`)), round: i };
      rounds.push(r);
      console.log(
        `  round ${i}: mixed ${r.mixed.perSecond}/s, no-op ${r.noop.perSecond}/s, ${r.violations.length === 0 ? 'checks pass' : r.violations.join('; ')}`,
      );
    }
  } finally {
    await load.close();
    await server.stop();
    if (db.isInitialized) await db.destroy();
    await dropDatabase(database);
  }
  const args = process.argv.slice(2);
  const markdown = toMarkdown(`npm run bench:mixed${args.length > 0 ? ` -- ${args.join(' ')}` : ''}`, rounds);
  console.log(`\n${markdown}`);
  if (!quick) updateBenchmarksMd('mixed', 'npm run bench:mixed', markdown);
  if (rounds.some((r) => r.violations.length > 0)) {
    console.error('\n*** MIXED-LOAD BENCHMARK FAILED: see the violations above. ***');
    process.exitCode = 1;
  }
}

await main();
