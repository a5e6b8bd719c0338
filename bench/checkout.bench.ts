// npm run bench:checkout [-- --winners 5000 --connections 200 --rounds 3 --release-share 0.2 --quick | --from-json bench/results/checkout.json]
// Checkout holds (issue 15): the winners of a sale hold their coupon for an order, then most confirm
// (payment) and the rest release (cancel), beside the plain redemption path (no hold) in the same
// server process and round. Reading the figures: BENCHMARKS.md, "Checkout holds".
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { DataSource } from 'typeorm';
import { signToken } from '../src/auth/jwt.js';
import { loadConfig } from '../src/config/app-config.js';
import { dataSourceOptions } from '../src/database/data-source-options.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { updateBenchmarksMd } from './benchmarks-md.js';
import { LoadGenerator, type Answer, type Shot } from './flash-sale/load.js';
import { dbEnv, dropDatabase, quietServerEnv } from './flash-sale/run-design.js';
import { saleWinners, type Winner } from './flash-sale/sale.js';
import { startServer, type RunningServer } from './flash-sale/server.js';
import { latency, type Latency } from './flash-sale/stats.js';

const { values: opt } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    winners: { type: 'string' },
    connections: { type: 'string' },
    rounds: { type: 'string' },
    warmup: { type: 'string' },
    'release-share': { type: 'string', default: '0.2' },
    out: { type: 'string', default: 'bench/results' },
    'from-json': { type: 'string' },
  },
});
const quick = opt.quick === true;
const intOpt = (v: string | undefined, full: number, small: number) => (v === undefined ? (quick ? small : full) : Number.parseInt(v, 10));
const WINNERS = intOpt(opt.winners, 5000, 500);
// The order service's connections, not a crowd of browsers: at 1,000 in flight on the shared 2-core
// machine a checkout request waits several seconds, close to REQUEST_TIMEOUT_MS.
const CONNECTIONS = intOpt(opt.connections, 200, 100);
const ROUNDS = intOpt(opt.rounds, 3, 1);
const WARMUP = intOpt(opt.warmup, 1000, 200);
const RELEASE_SHARE = Number(opt['release-share']);
if (![WINNERS, CONNECTIONS, ROUNDS, WARMUP].every((n) => Number.isInteger(n) && n > 0) || !(RELEASE_SHARE >= 0 && RELEASE_SHARE < 1)) {
  console.error('--winners, --connections, --rounds and --warmup take positive integers, --release-share a fraction in [0, 1)');
  process.exit(2);
}

const JWT_SECRET = randomBytes(24).toString('hex');
const admin = `Bearer ${signToken(JWT_SECRET, 'bench-admin', ['admin'], 4 * 3600)}`;
// The order service's token: it holds, confirms and releases on behalf of every user.
const orders = `Bearer ${signToken(JWT_SECRET, 'bench-orders', ['service'], 4 * 3600)}`;
const database = `ce_bench_checkout_${process.pid}`;
/** Over couponBody's 10,000-cent threshold, so every hold and redemption is allowed its 1,000 off. */
const ORDER_CENTS = 20_000;

type Kind = 'plain' | 'hold' | 'confirm' | 'release';
const EXPECTED_STATUS: Record<Kind, number> = { plain: 201, hold: 201, confirm: 201, release: 200 };

interface Phase {
  name: 'plain' | 'hold' | 'settle';
  wallMs: number;
  serverCpuMs: number;
  loadAverage: number;
  byKind: Partial<Record<Kind, { n: number; perSecond: number; latency: Latency }>>;
}

interface Report {
  command: string;
  startedAt: string;
  machine: string;
  winners: number;
  connections: number;
  warmup: number;
  rounds: Round[];
}

interface Round {
  round: number;
  order: string;
  phases: Phase[];
  loadAverage: { atStart: number; atEnd: number };
  violations: string[];
}

const loadAvg = () => Math.round(os.loadavg()[0] * 100) / 100;
const r1 = (x: number) => Math.round(x * 10) / 10;

const shot = (w: Winner, body: Record<string, unknown>, path?: string): Shot => ({
  userId: w.userId,
  authorization: orders,
  body: JSON.stringify({ userCouponId: w.userCouponId, orderNo: w.orderNo, userId: w.userId, ...body }),
  ...(path ? { path } : {}),
});

/** Every `1 / share`-th winner releases instead of confirming, so the releases are spread through the burst. */
const releases = (share: number) => (i: number) => share > 0 && Math.floor((i + 1) * share) > Math.floor(i * share);

async function timed(
  server: RunningServer,
  load: LoadGenerator,
  name: Phase['name'],
  path: string,
  shots: Shot[],
  kinds: Kind[],
): Promise<{ phase: Phase; answers: Answer[] }> {
  const cpu0 = server.cpuSeconds();
  const result = await load.fire(path, shots);
  const serverCpuMs = (server.cpuSeconds() - cpu0) * 1000;
  const byKind: Phase['byKind'] = {};
  for (const kind of new Set(kinds)) {
    const mine = result.answers.filter((a) => kinds[a.shot] === kind);
    byKind[kind] = {
      n: mine.length,
      // A kind's share of the burst: its answers over the burst's wall time.
      perSecond: r1((mine.length / result.wallMs) * 1000),
      latency: latency(mine.map((a) => a.latencyMs)) as Latency,
    };
  }
  return {
    phase: { name, wallMs: r1(result.wallMs), serverCpuMs: r1(serverCpuMs), loadAverage: loadAvg(), byKind },
    answers: result.answers,
  };
}

/**
 * One round: two sales of `n` winners each; one sale's winners redeem at once (the plain path), the
 * other's hold, then confirm or release. Which goes first alternates by round. Returns the timed
 * phases and what the database says afterwards.
 */
async function round(server: RunningServer, load: LoadGenerator, db: DataSource, label: string, n: number, plainFirst: boolean) {
  const atStart = loadAvg();
  const plain = await saleWinners(server.url, load, { admin, jwtSecret: JWT_SECRET }, `${label}-p`, n);
  const checkout = await saleWinners(server.url, load, { admin, jwtSecret: JWT_SECRET }, `${label}-c`, n);
  const releasing = releases(RELEASE_SHARE);
  const phases: Phase[] = [];
  const answers = new Map<Phase['name'], Answer[]>();
  const run = async (name: Phase['name'], path: string, shots: Shot[], kinds: Kind[]) => {
    const t = await timed(server, load, name, path, shots, kinds);
    phases.push(t.phase);
    answers.set(name, t.answers);
  };
  const plainPhase = () =>
    run(
      'plain',
      '/redemptions',
      plain.map((w) => shot(w, { orderAmountCents: ORDER_CENTS })),
      plain.map(() => 'plain'),
    );
  const checkoutPhases = async () => {
    await run(
      'hold',
      '/redemptions/holds',
      checkout.map((w) => shot(w, { orderAmountCents: ORDER_CENTS })),
      checkout.map(() => 'hold'),
    );
    await run(
      'settle',
      '/redemptions',
      checkout.map((w, i) => (releasing(i) ? shot(w, {}, '/redemptions/holds/release') : shot(w, { orderAmountCents: ORDER_CENTS }))),
      checkout.map((_, i) => (releasing(i) ? 'release' : 'confirm')),
    );
  };
  if (plainFirst) {
    await plainPhase();
    await checkoutPhases();
  } else {
    await checkoutPhases();
    await plainPhase();
  }
  const violations = [
    ...wrongAnswers('plain', answers.get('plain') ?? [], () => 'plain'),
    ...wrongAnswers('hold', answers.get('hold') ?? [], () => 'hold'),
    ...wrongAnswers('settle', answers.get('settle') ?? [], (i) => (releasing(i) ? 'release' : 'confirm')),
    ...(await verify(db, plain, checkout, releasing, answers)),
  ];
  return { phases, violations, loadAverage: { atStart, atEnd: loadAvg() } };
}

function wrongAnswers(phase: string, answers: readonly Answer[], kind: (i: number) => Kind): string[] {
  const wrong = answers.filter((a) => a.status !== EXPECTED_STATUS[kind(a.shot)] || a.id === null);
  if (wrong.length === 0) return [];
  const classes = new Map<string, number>();
  for (const a of wrong)
    classes.set(`${kind(a.shot)} ${a.status} ${a.code ?? ''}`, (classes.get(`${kind(a.shot)} ${a.status} ${a.code ?? ''}`) ?? 0) + 1);
  return [`${phase}: ${wrong.length} unexpected answers: ${[...classes].map(([c, k]) => `${c.trim()} ×${k}`).join(', ')}`];
}

/**
 * The database after a round, independently of the code under test: every confirmed or plainly
 * redeemed coupon USED with exactly one redemption (the one it was answered with), every released one
 * UNUSED with none and its hold RELEASED/CANCELLED, every hold the one answered, none ACTIVE, nothing
 * LOCKED, and API.md's invariants (6 among them) over the whole database.
 */
async function verify(
  db: DataSource,
  plain: readonly Winner[],
  checkout: readonly Winner[],
  releasing: (i: number) => boolean,
  answers: Map<Phase['name'], Answer[]>,
): Promise<string[]> {
  const ids = [...plain, ...checkout].map((w) => w.userCouponId);
  const coupons = new Map(
    ((await db.query(`SELECT id, status FROM user_coupon WHERE id IN (?)`, [ids])) as { id: string; status: string }[]).map((r) => [
      String(r.id),
      r.status,
    ]),
  );
  const redemptions = new Map<string, string[]>();
  for (const r of (await db.query(`SELECT id, user_coupon_id, order_no FROM redemption WHERE user_coupon_id IN (?)`, [ids])) as {
    id: string;
    user_coupon_id: string;
    order_no: string;
  }[])
    redemptions.set(String(r.user_coupon_id), [...(redemptions.get(String(r.user_coupon_id)) ?? []), `${r.order_no}=${r.id}`]);
  const holds = new Map<string, { id: string; order_no: string; status: string; release_reason: string | null }[]>();
  for (const h of (await db.query(
    `SELECT id, user_coupon_id, order_no, status, release_reason FROM redemption_hold WHERE user_coupon_id IN (?)`,
    [ids],
  )) as { id: string; user_coupon_id: string; order_no: string; status: string; release_reason: string | null }[])
    holds.set(String(h.user_coupon_id), [...(holds.get(String(h.user_coupon_id)) ?? []), { ...h, id: String(h.id) }]);

  const wrong: string[] = [];
  const note = (what: string, uc: string) => wrong.push(`user coupon ${uc}: ${what}`);
  plain.forEach((w, i) => {
    const answered = answers.get('plain')?.[i]?.id;
    if (coupons.get(w.userCouponId) !== 'USED') note(`redeemed without a hold, but ${coupons.get(w.userCouponId)}`, w.userCouponId);
    if (JSON.stringify(redemptions.get(w.userCouponId)) !== JSON.stringify([`${w.orderNo}=${answered}`]))
      note(`answered redemption ${answered}, stored ${JSON.stringify(redemptions.get(w.userCouponId))}`, w.userCouponId);
    if (holds.has(w.userCouponId)) note('redeemed without a hold, but has one', w.userCouponId);
  });
  checkout.forEach((w, i) => {
    const hold = holds.get(w.userCouponId) ?? [];
    const answeredHold = answers.get('hold')?.[i]?.id;
    if (hold.length !== 1 || hold[0].id !== answeredHold || hold[0].order_no !== w.orderNo)
      return note(`answered hold ${answeredHold}, stored ${JSON.stringify(hold)}`, w.userCouponId);
    const settled = answers.get('settle')?.[i]?.id;
    const stored = redemptions.get(w.userCouponId);
    if (releasing(i)) {
      if (coupons.get(w.userCouponId) !== 'UNUSED') note(`released, but ${coupons.get(w.userCouponId)}`, w.userCouponId);
      if (hold[0].status !== 'RELEASED' || hold[0].release_reason !== 'CANCELLED')
        note(`released, hold ${JSON.stringify(hold[0])}`, w.userCouponId);
      if (settled !== answeredHold) note(`release answered hold ${settled}, held ${answeredHold}`, w.userCouponId);
      if (stored) note(`released, but redeemed ${JSON.stringify(stored)}`, w.userCouponId);
    } else {
      if (coupons.get(w.userCouponId) !== 'USED') note(`confirmed, but ${coupons.get(w.userCouponId)}`, w.userCouponId);
      if (hold[0].status !== 'CONFIRMED') note(`confirmed, hold ${JSON.stringify(hold[0])}`, w.userCouponId);
      if (JSON.stringify(stored) !== JSON.stringify([`${w.orderNo}=${settled}`]))
        note(`answered redemption ${settled}, stored ${JSON.stringify(stored)}`, w.userCouponId);
    }
  });
  const [left] = (await db.query(
    `SELECT (SELECT COUNT(*) FROM user_coupon WHERE status = 'LOCKED') AS locked, (SELECT COUNT(*) FROM redemption_hold WHERE status = 'ACTIVE') AS active`,
  )) as { locked: string; active: string }[];
  if (Number(left.locked) + Number(left.active) > 0)
    wrong.push(`after every hold was settled: ${left.locked} coupons LOCKED, ${left.active} holds ACTIVE`);
  // The first few of each kind are enough to read; the count says how many.
  const shown = wrong.length > 10 ? [...wrong.slice(0, 10), `... ${wrong.length - 10} more`] : wrong;
  return [...shown, ...(await checkInvariants(db)).map((v) => `invariant ${v}`)];
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
};
const num = (x: number | undefined, digits = 0) =>
  x === undefined ? '–' : x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

function toMarkdown(rep: Report): string {
  const { rounds, winners } = rep;
  const get = (r: Round, phase: Phase['name'], kind: Kind) => r.phases.find((p) => p.name === phase)?.byKind[kind];
  const phaseOf = (r: Round, phase: Phase['name']) => r.phases.find((p) => p.name === phase);
  const ratios = rounds.map((r) => {
    const plain = get(r, 'plain', 'plain');
    const settle = phaseOf(r, 'settle');
    const settlePerSecond = settle ? (winners / settle.wallMs) * 1000 : 0;
    const base = plain?.perSecond ?? NaN;
    const p99 = plain?.latency.p99 ?? NaN;
    return {
      hold: (get(r, 'hold', 'hold')?.perSecond ?? NaN) / base,
      settle: settlePerSecond / base,
      holdP99: (get(r, 'hold', 'hold')?.latency.p99 ?? NaN) / p99,
      confirmP99: (get(r, 'settle', 'confirm')?.latency.p99 ?? NaN) / p99,
      releaseP99: (get(r, 'settle', 'release')?.latency.p99 ?? NaN) / p99,
      // CPU per request moves much less with the machine's other load than wall-clock rates do.
      holdCpu: (phaseOf(r, 'hold')?.serverCpuMs ?? NaN) / (phaseOf(r, 'plain')?.serverCpuMs ?? NaN),
      settleCpu: (phaseOf(r, 'settle')?.serverCpuMs ?? NaN) / (phaseOf(r, 'plain')?.serverCpuMs ?? NaN),
      settlePerSecond,
    };
  });
  const lat = (l: Latency | undefined) => (l ? `${num(l.p50, 1)} / ${num(l.p99, 1)} / ${num(l.max, 1)}` : '–');
  const releasesPerRound = get(rounds[0], 'settle', 'release')?.n ?? 0;
  const out = [
    `Checkout: per round, two sales of ${num(winners)} coupons, each won by ${num(winners)} distinct users (grabs, not timed). ` +
      `One sale's winners redeem at once (plain: \`POST /redemptions\`, no hold); the other's are held (\`POST /redemptions/holds\`), ` +
      `then in one burst ${num(winners - releasesPerRound)} confirm (\`POST /redemptions\` on the hold) and ${num(releasesPerRound)} release ` +
      `(\`POST /redemptions/holds/release\`), spread through it. Every request by the order service's token, ${num(ORDER_CENTS)} cents, ` +
      `over ${num(rep.connections)} keep-alive connections (closed loop, flash-sale's load generator). One server process (\`dist/src/main.js\`, NODE_ENV=production, ` +
      `rate limiter and webhook relay off), one database, ${num(rep.warmup)} winners' checkout and redemption first as a warm-up; the plain phase runs first in odd rounds, last in even ones.`,
    '',
    `Command: \`${rep.command}\` · ${rep.startedAt} · ${rep.machine}.`,
    '',
    '| round | load avg (1 min) start → end | plain redemptions/s | holds/s | confirms/s + releases/s (settle burst) | holds ÷ plain | settle burst ÷ plain | server CPU ms per request: plain / hold / settle | CPU per request: hold ÷ plain, settle ÷ plain | checks |',
    '|--:|---|--:|--:|--:|--:|--:|--:|--:|---|',
    ...rounds.map((r, i) => {
      const x = ratios[i];
      const cpu = (['plain', 'hold', 'settle'] as const).map((p) => phaseOf(r, p)?.serverCpuMs);
      return (
        `| ${r.round} | ${r.loadAverage.atStart} → ${r.loadAverage.atEnd} | ${num(get(r, 'plain', 'plain')?.perSecond)} | ${num(get(r, 'hold', 'hold')?.perSecond)} | ` +
        `${num(get(r, 'settle', 'confirm')?.perSecond)} + ${num(get(r, 'settle', 'release')?.perSecond)} = ${num(x.settlePerSecond)} | ${x.hold.toFixed(2)} | ${x.settle.toFixed(2)} | ` +
        `${cpu.map((ms) => (ms === undefined ? '–' : num(ms / winners, 2))).join(' / ')} | ${x.holdCpu.toFixed(2)}, ${x.settleCpu.toFixed(2)} | ${r.violations.length === 0 ? 'pass' : `**FAIL**: ${r.violations.length}`} |`
      );
    }),
    ...(rounds.length > 1
      ? [
          `| median | | | | | ${median(ratios.map((x) => x.hold)).toFixed(2)} | ${median(ratios.map((x) => x.settle)).toFixed(2)} | | ` +
            `${median(ratios.map((x) => x.holdCpu)).toFixed(2)}, ${median(ratios.map((x) => x.settleCpu)).toFixed(2)} | |`,
        ]
      : []),
    '',
    "Latency in ms, p50 / p99 / max, from sending a request to reading its answer; ratios are p99 over the same round's plain redemption p99:",
    '',
    '| round | plain redemption | hold | confirm | release | hold p99 ÷ plain | confirm p99 ÷ plain | release p99 ÷ plain |',
    '|--:|---|---|---|---|--:|--:|--:|',
    ...rounds.map((r, i) => {
      const x = ratios[i];
      return (
        `| ${r.round} | ${lat(get(r, 'plain', 'plain')?.latency)} | ${lat(get(r, 'hold', 'hold')?.latency)} | ${lat(get(r, 'settle', 'confirm')?.latency)} | ` +
        `${lat(get(r, 'settle', 'release')?.latency)} | ${x.holdP99.toFixed(2)} | ${x.confirmP99.toFixed(2)} | ${x.releaseP99.toFixed(2)} |`
      );
    }),
    ...(rounds.length > 1
      ? [
          `| median | | | | | ${median(ratios.map((x) => x.holdP99)).toFixed(2)} | ${median(ratios.map((x) => x.confirmP99)).toFixed(2)} | ${median(ratios.map((x) => x.releaseP99)).toFixed(2)} |`,
        ]
      : []),
    '',
    "Confirms/s and releases/s are each kind's answers over the settle burst's wall time (the two share the burst, so they add up to its rate). " +
      'Checks after every round, in SQL on a separate connection: every confirmed and every plainly redeemed coupon USED with exactly the one redemption it was answered with, ' +
      'every released one UNUSED with no redemption and its hold RELEASED (CANCELLED), every hold the one answered, no coupon LOCKED and no hold ACTIVE, ' +
      "every answer 201 (200 for a release), and API.md's invariants over the whole database.",
  ];
  const failing = rounds.filter((r) => r.violations.length > 0);
  if (failing.length > 0)
    out.push('', '### Violations', '', ...failing.flatMap((r) => [`- round ${r.round}:`, ...r.violations.map((v) => `  - ${v}`)]));
  return out.join('\n');
}

async function measure(): Promise<Report> {
  const startedAt = new Date().toISOString();
  // No webhook relay: it would work off the events of whatever ran before (the setup's grabs) inside the next timed phase.
  const env = { ...quietServerEnv(database, JWT_SECRET), WEBHOOK_RELAY_ENABLED: 'false' };
  const server = await startServer({ entry: 'dist/src/main.js', env });
  const load = new LoadGenerator(server.url, CONNECTIONS);
  const db = new DataSource({ ...dataSourceOptions(loadConfig({ ...dbEnv(), DB_NAME: database })), poolSize: 2 });
  const rounds: Round[] = [];
  try {
    await db.initialize();
    console.log(`checkout bench: ${WINNERS} winners per sale, ${CONNECTIONS} connections, ${ROUNDS} rounds; warm-up with ${WARMUP}...`);
    const warm = await round(server, load, db, 'warm', WARMUP, true);
    if (warm.violations.length > 0) throw new Error(`warm-up: ${warm.violations.join('; ')}`);
    for (let i = 1; i <= ROUNDS; i++) {
      const plainFirst = i % 2 === 1;
      const r = await round(server, load, db, `r${i}`, WINNERS, plainFirst);
      rounds.push({ round: i, order: plainFirst ? 'plain, hold, settle' : 'hold, settle, plain', ...r });
      const by = (p: string) => r.phases.find((x) => x.name === p);
      console.log(
        `  round ${i}: plain ${by('plain')?.byKind.plain?.perSecond}/s, hold ${by('hold')?.byKind.hold?.perSecond}/s, ` +
          `confirm ${by('settle')?.byKind.confirm?.perSecond}/s + release ${by('settle')?.byKind.release?.perSecond}/s, load ${r.loadAverage.atStart} → ${r.loadAverage.atEnd}, ` +
          `${r.violations.length === 0 ? 'checks pass' : `${r.violations.length} violations`}`,
      );
    }
  } finally {
    await load.close();
    await server.stop();
    if (db.isInitialized) await db.destroy();
    await dropDatabase(database);
  }
  const args = process.argv.slice(2);
  return {
    command: `npm run bench:checkout${args.length > 0 ? ` -- ${args.join(' ')}` : ''}`,
    startedAt,
    machine: `${os.cpus().length} × ${os.cpus()[0]?.model.trim() ?? 'unknown'}, Node ${process.version}`,
    winners: WINNERS,
    connections: CONNECTIONS,
    warmup: WARMUP,
    rounds,
  };
}

async function main(): Promise<void> {
  // --from-json re-renders a saved run (after a change to the report's layout) without measuring again.
  const fromJson = opt['from-json'];
  const rep = fromJson ? (JSON.parse(readFileSync(fromJson, 'utf8')) as Report) : await measure();
  const { rounds } = rep;
  const markdown = toMarkdown(rep);
  console.log(`\n${markdown}`);
  if (!quick) {
    mkdirSync(opt.out as string, { recursive: true });
    if (!fromJson) writeFileSync(`${opt.out}/checkout.json`, `${JSON.stringify(rep, null, 2)}\n`);
    updateBenchmarksMd('checkout', 'npm run bench:checkout', markdown);
    console.log(`written: ${fromJson ? '' : `${opt.out}/checkout.json, `}BENCHMARKS.md`);
  }
  if (rounds.some((r) => r.violations.length > 0)) {
    for (const r of rounds) for (const v of r.violations) console.error(`round ${r.round}: ${v}`);
    console.error('\n*** CHECKOUT BENCHMARK FAILED: see the violations above. ***');
    process.exitCode = 1;
  } else {
    console.log('\nAll checks passed.');
  }
}

await main();
