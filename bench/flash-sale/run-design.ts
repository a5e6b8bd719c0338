import { DataSource } from 'typeorm';
import { loadConfig } from '../../src/config/app-config.js';
import { dataSourceOptions } from '../../src/database/data-source-options.js';
import { couponBody } from '../../test/support/coupon-body.js';
import { dropTestDatabase, pickEnv } from '../../test/support/database.js';
import { LIST_COUPONS, type Design, type Scenario } from './designs.js';
import { LoadGenerator, type LoadResult, type Shot } from './load.js';
import { cpuSeconds, localDatabasePid, startServer } from './server.js';
import { answerClass, byClass, type Latency } from './stats.js';
import { answerViolations, countViolations, verifyGrabRun, type Verification } from './verify.js';
import { runWrk, type WrkResult } from './wrk.js';

export interface Workload {
  grabs: Shot[];
  /** Grabs on a separate coupon before the timed part, so every design is measured with a warm JIT, open sockets and a full pool. */
  warmup: Shot[];
  stock: number;
  connections: number;
  jwtSecret: string;
  adminAuthorization: string;
  keepDatabases: boolean;
  /** Also load the same server with wrk after the Node generator's timed part (rate limiter off only). */
  wrk?: { seconds: number; connections: number; users: Shot[] };
}

export interface RunResult {
  /** Set by the caller when the plan runs more than once. */
  round?: number;
  scenario: Scenario['id'];
  design: string;
  title: string;
  database: string;
  grabs: number;
  stock: number;
  connections: { configured: number; used: number; maxInFlight: number };
  wallMs: number;
  answeredPerSecond: number;
  /** Successes per second until the last success: the rate coupons went out while there were any. */
  issuedPerSecond: number | null;
  lastSuccessAtMs: number | null;
  /**
   * A grab run's answers per second in its two phases. The sale: answers until the last success,
   * every grab decided by a group's transaction. Sold out: answers to grabs sent after it, refused
   * from memory with one batched key lookup. The last group's own refusals, sent before and answered
   * just after the last success, count in neither. Null for other designs and when nothing was
   * issued; soldOutPerSecond is null when no grab was sent after the last success.
   */
  phases: { salePerSecond: number; soldOutPerSecond: number | null } | null;
  counts: Record<string, number>;
  latencyMs: Record<string, Latency>;
  memory: { peakRssMiB: number; rssBeforeTimedMiB: number; peakRssDuringTimedMiB: number };
  /**
   * CPU used during the timed part, per answer: the server's, the local database server's (null
   * when it is not on this machine), and this load generator's, which share the machine's cores. On
   * a shared machine wall-clock figures move with everyone else's load; CPU per answer moves much
   * less, so it is the figure to compare across runs.
   */
  cpu: {
    serverSeconds: number;
    serverMsPerAnswer: number;
    databaseMsPerAnswer: number | null;
    loadGeneratorSeconds: number;
    loadGeneratorMsPerAnswer: number;
  };
  limiter?: { ratePerSecond: number; admitted: number; rejected: number; admissibleAtMost: number };
  /** The same design loaded by wrk, on the same server after the Node generator's run; its own checks. */
  wrk?: WrkResult & { violations: string[] };
  verification?: Omit<Verification, 'violations'>;
  violations: string[];
  /** A violation in a design that must hold: the whole benchmark exits non-zero. */
  failed: boolean;
}

const MiB = 1024 * 1024;

function phases(result: LoadResult, lastSuccessAtMs: number): NonNullable<RunResult['phases']> {
  const during = result.answers.filter((a) => a.doneAtMs <= lastSuccessAtMs).length;
  const sentAfter = result.answers.filter((a) => a.doneAtMs - a.latencyMs > lastSuccessAtMs).length;
  const rest = result.wallMs - lastSuccessAtMs;
  return {
    salePerSecond: round((during / lastSuccessAtMs) * 1000),
    soldOutPerSecond: sentAfter > 0 && rest > 0 ? round((sentAfter / rest) * 1000) : null,
  };
}
const round = (x: number, digits = 1) => Math.round(x * 10 ** digits) / 10 ** digits;

export const dbEnv = () => pickEnv('DB_HOST', 'DB_PORT', 'DB_USER', 'DB_PASSWORD', 'DB_POOL_SIZE');

/** The shipped server's environment in a single-feature benchmark: production mode, its own database, no crons, no rate limits. */
export const quietServerEnv = (database: string, jwtSecret: string) => ({
  ...dbEnv(),
  DB_NAME: database,
  JWT_SECRET: jwtSecret,
  NODE_ENV: 'production',
  LOG_LEVEL: 'warn',
  SCHEDULER_ENABLED: 'false',
  RATE_LIMIT_ENABLED: 'false',
});

export async function createCoupon(url: string, authorization: string, totalStock: number, rateLimitPerSecond?: number): Promise<string> {
  const body = couponBody({ name: 'bench flash sale', totalStock, ...(rateLimitPerSecond ? { rateLimitPerSecond } : {}) });
  const res = await fetch(`${url}/admin/coupons`, {
    method: 'POST',
    headers: { authorization, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const json = (await res.json()) as { id?: string };
  if (res.status !== 201 || !json.id) throw new Error(`POST /admin/coupons answered ${res.status}: ${JSON.stringify(json)}`);
  return json.id;
}

export const dropDatabase = (name: string) => dropTestDatabase(loadConfig({ ...dbEnv(), DB_NAME: name }));

/** One design under one scenario: its own server process, its own fresh database, the same workload. */
export async function runDesign(design: Design, scenario: Scenario, w: Workload, database: string): Promise<RunResult> {
  const server = await startServer({
    entry: design.entry,
    env: {
      ...dbEnv(),
      DB_NAME: database,
      JWT_SECRET: w.jwtSecret,
      LOG_LEVEL: 'warn',
      NODE_ENV: 'production',
      ...scenario.env,
      ...design.env,
    },
  });
  const load = new LoadGenerator(server.url, w.connections);
  let couponId = '';
  let result: LoadResult;
  let rssBefore: number;
  let rssDuring = 0;
  let peakRss: number;
  let serverCpu: number;
  let databaseCpu: number | null = null;
  let clientCpu: NodeJS.CpuUsage;
  const dbPid = localDatabasePid();
  let wrk: WrkResult | undefined;
  let wrkCoupon = '';
  let limiterAdmitted = 0;
  try {
    const warmCoupon =
      design.kind !== 'noop'
        ? await createCoupon(server.url, w.adminAuthorization, Math.ceil(w.warmup.length / 2), scenario.limiterRate)
        : '0';
    if (design.kind !== 'noop') couponId = await createCoupon(server.url, w.adminAuthorization, w.stock, scenario.limiterRate);
    // The list shows a realistic page: the two coupons above and others up to one full page.
    if (design.id === 'list') for (let i = 2; i < LIST_COUPONS; i++) await createCoupon(server.url, w.adminAuthorization, w.stock);
    await load.fire(design.route(warmCoupon), w.warmup, design.method);
    rssBefore = server.rss();
    const sampler = setInterval(() => (rssDuring = Math.max(rssDuring, server.rss())), 50);
    const cpuBefore = server.cpuSeconds();
    const dbCpuBefore = dbPid === null ? 0 : cpuSeconds(dbPid);
    const clientBefore = process.cpuUsage();
    try {
      result = await load.fire(design.route(couponId), w.grabs, design.method);
    } finally {
      clearInterval(sampler);
    }
    serverCpu = server.cpuSeconds() - cpuBefore;
    if (dbPid !== null) databaseCpu = cpuSeconds(dbPid) - dbCpuBefore;
    clientCpu = process.cpuUsage(clientBefore);
    rssDuring = Math.max(rssDuring, server.rss());
    peakRss = server.peakRss();
    if (scenario.limiterRate !== undefined) limiterAdmitted = await admittedByLimiter(server.url, couponId);
    if (w.wrk && scenario.id === 'throughput') {
      // Grabs need a coupon with stock again, and users of their own.
      if (design.kind === 'grab') wrkCoupon = await createCoupon(server.url, w.adminAuthorization, w.stock);
      wrk = await runWrk({
        url: server.url,
        path: design.route(design.kind === 'grab' ? wrkCoupon : couponId),
        method: design.method ?? 'POST',
        connections: w.wrk.connections,
        seconds: w.wrk.seconds,
        users: design.kind === 'grab' ? w.wrk.users : undefined,
        authorization: design.kind === 'noop' ? w.grabs[0].authorization : undefined,
        serverCpuSeconds: () => server.cpuSeconds(),
      });
    }
  } finally {
    await load.close();
    await server.stop();
  }

  const counts: Record<string, number> = {};
  for (const a of result.answers) counts[answerClass(a)] = (counts[answerClass(a)] ?? 0) + 1;
  const successes = result.answers.filter((a) => answerClass(a) === 'SUCCESS');
  const lastSuccessAtMs = design.kind === 'grab' && successes.length > 0 ? Math.max(...successes.map((a) => a.doneAtMs)) : null;
  const allowed =
    design.kind !== 'grab' ? ['SUCCESS'] : scenario.id === 'limiter' ? ['SUCCESS', 'SOLD_OUT', 'RATE_LIMITED'] : ['SUCCESS', 'SOLD_OUT'];

  let verification: Verification | undefined;
  let violations: string[];
  const wrkViolations = wrk ? Object.entries(wrk.errors).flatMap(([k, n]) => (n > 0 ? [`wrk: ${n} socket errors (${k})`] : [])) : [];
  if (wrk?.wrapped) wrkViolations.push(`wrk sent more grabs than the ${w.wrk?.users.length} users signed for it: keys repeated`);
  if (wrk && design.kind !== 'grab') wrkViolations.push(...countViolations(wrk.counts, allowed));
  if (design.kind === 'grab') {
    const db = new DataSource({ ...dataSourceOptions(loadConfig({ ...dbEnv(), DB_NAME: database })), poolSize: 2 });
    await db.initialize();
    try {
      verification = await verifyGrabRun(db, couponId, w.grabs, result.answers, {
        sellsOut: scenario.id === 'throughput' && w.grabs.length >= w.stock,
        allowedAnswers: allowed,
      });
      if (wrk)
        wrkViolations.push(
          ...(
            await verifyGrabRun(
              db,
              wrkCoupon,
              [],
              { counts: wrk.counts, inFlightAtEnd: wrk.connections },
              { sellsOut: false, allowedAnswers: allowed },
            )
          ).violations,
        );
    } finally {
      await db.destroy();
    }
    violations = verification.violations;
  } else {
    violations = answerViolations(result.answers, allowed);
    const wrong = design.id === 'page' ? result.answers.filter((a) => a.status === 200 && a.id !== couponId).length : 0;
    if (wrong > 0) violations.push(`${wrong} coupon pages answered another coupon than ${couponId}`);
    const empty = design.id === 'list' ? result.answers.filter((a) => a.status === 200 && a.id === null).length : 0;
    if (empty > 0) violations.push(`${empty} list pages listed no coupon (the list has ${LIST_COUPONS} live ones)`);
  }

  let limiter: RunResult['limiter'];
  if (scenario.limiterRate !== undefined) {
    const rate = scenario.limiterRate;
    const rejected = counts.RATE_LIMITED ?? 0;
    // A token bucket of capacity R refilled at R/s cannot admit more than R * (1 + seconds) in any window.
    const admissibleAtMost = Math.floor(rate * (1 + result.wallMs / 1000));
    // Counted by the server: a grab refused from memory once the instance saw the sell-out never
    // reaches the limiter, so the answers that are not 429 are more than it admitted.
    limiter = { ratePerSecond: rate, admitted: limiterAdmitted, rejected, admissibleAtMost };
    const decided = limiterAdmitted + rejected;
    if (decided > result.answers.length) violations.push(`the limiter decided ${decided} grabs of the ${result.answers.length} sent`);
    if (successes.length > limiterAdmitted)
      violations.push(`${successes.length} coupons issued, but the limiter admitted ${limiterAdmitted}`);
    if (limiter.admitted > admissibleAtMost)
      violations.push(
        `the limiter admitted ${limiter.admitted}, more than ${admissibleAtMost} its bucket allows in ${round(result.wallMs)} ms`,
      );
  }
  if (!w.keepDatabases) await dropDatabase(database);

  return {
    scenario: scenario.id,
    design: design.id,
    title: design.title,
    database,
    grabs: w.grabs.length,
    stock: w.stock,
    connections: { configured: w.connections, used: result.connectionsUsed, maxInFlight: result.maxInFlight },
    wallMs: round(result.wallMs),
    answeredPerSecond: round((result.answers.length / result.wallMs) * 1000),
    issuedPerSecond: lastSuccessAtMs ? round((successes.length / lastSuccessAtMs) * 1000) : null,
    lastSuccessAtMs: lastSuccessAtMs === null ? null : round(lastSuccessAtMs),
    phases: lastSuccessAtMs ? phases(result, lastSuccessAtMs) : null,
    counts,
    latencyMs: byClass(result.answers),
    memory: { peakRssMiB: round(peakRss / MiB), rssBeforeTimedMiB: round(rssBefore / MiB), peakRssDuringTimedMiB: round(rssDuring / MiB) },
    cpu: {
      serverSeconds: round(serverCpu, 2),
      serverMsPerAnswer: round((serverCpu * 1000) / result.answers.length, 3),
      databaseMsPerAnswer: databaseCpu === null ? null : round((databaseCpu * 1000) / result.answers.length, 3),
      loadGeneratorSeconds: round((clientCpu.user + clientCpu.system) / 1e6, 2),
      loadGeneratorMsPerAnswer: round((clientCpu.user + clientCpu.system) / 1e3 / result.answers.length, 3),
    },
    limiter,
    verification: verification && {
      initStock: verification.initStock,
      stockLeft: verification.stockLeft,
      issued: verification.issued,
      oversold: verification.oversold,
      usersWithTwo: verification.usersWithTwo,
    },
    wrk: wrk && { ...wrk, violations: wrkViolations },
    violations,
    failed: design.mustHold && violations.length + wrkViolations.length > 0,
  };
}

/** The grabs of the coupon the server's limiter admitted (its `rate_limit_grab_decisions_total`), warm-up excluded. */
async function admittedByLimiter(url: string, couponId: string): Promise<number> {
  const answer = await fetch(`${url}/metrics`);
  if (!answer.ok) throw new Error(`GET /metrics answered ${answer.status}: the limiter's admissions cannot be counted`);
  const text = await answer.text();
  const line = text
    .split('\n')
    .find(
      (l) => l.startsWith('rate_limit_grab_decisions_total{') && l.includes(`coupon_id="${couponId}"`) && l.includes('result="admitted"'),
    );
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
}
