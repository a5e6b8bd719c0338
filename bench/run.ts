// npm run bench [-- --quick] : the flash-sale benchmark (issue 8). Options are described in docs/bench.md.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { parseArgs } from 'node:util';
import mysql from 'mysql2/promise';
import { signToken } from '../src/auth/jwt.js';
import { loadConfig } from '../src/config/app-config.js';
import { updateBenchmarksMd } from './benchmarks-md.js';
import {
  COUPON_LIST,
  COUPON_PAGE,
  limiterScenario,
  NOOP,
  NOOP_AHEAD,
  READ_THEN_WRITE,
  shippedDesigns,
  THROUGHPUT,
  TX_CONDITIONAL,
  type Design,
  type Scenario,
} from './flash-sale/designs.js';
import type { Shot } from './flash-sale/load.js';
import { toMarkdown, type Machine, type Report } from './flash-sale/report.js';
import { runDesign, type RunResult, type Workload } from './flash-sale/run-design.js';
import { wrkAvailable } from './flash-sale/wrk.js';

const { values: opt } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    grabs: { type: 'string' },
    stock: { type: 'string' },
    connections: { type: 'string' },
    warmup: { type: 'string' },
    rounds: { type: 'string', default: '1' },
    designs: { type: 'string' },
    // Both grab strategies by default, so issue 9's grouped-vs-per-request ratio comes from every run.
    strategies: { type: 'string', default: process.env.BENCH_GRAB_STRATEGIES ?? 'grouped,per-request' },
    'limiter-rates': { type: 'string' },
    'no-limiter': { type: 'boolean', default: false },
    'keep-db': { type: 'boolean', default: false },
    // wrk (an independent load generator in C) loads each server again after the Node generator, when installed.
    'no-wrk': { type: 'boolean', default: false },
    'wrk-seconds': { type: 'string', default: '5' },
    'wrk-users': { type: 'string', default: '120000' },
    out: { type: 'string', default: 'bench/results' },
    'from-json': { type: 'string' },
  },
});

const quick = opt.quick === true;
const intOpt = (v: string | undefined, full: number, small: number) => (v === undefined ? (quick ? small : full) : Number.parseInt(v, 10));
const grabs = intOpt(opt.grabs, 10_000, 2_000);
const stock = intOpt(opt.stock, 5_000, 500);
const connections = intOpt(opt.connections, 1_000, 200);
const warmupGrabs = intOpt(opt.warmup, 2_000, 400);
const rounds = Number.parseInt(opt.rounds as string, 10);
if (![grabs, stock, connections, warmupGrabs, rounds].every((n) => Number.isInteger(n) && n > 0)) {
  console.error('--grabs, --stock, --connections, --warmup and --rounds take positive integers');
  process.exit(2);
}

const list = (s: string | undefined) =>
  (s ?? '')
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);
const shipped = shippedDesigns(list(opt.strategies));
const everyDesign: Design[] = [READ_THEN_WRITE, TX_CONDITIONAL, ...shipped, COUPON_PAGE, COUPON_LIST, NOOP, NOOP_AHEAD];
// --quick is the correctness check after a change to the grab path: the shipped path only.
const wanted = list(opt.designs ?? (quick ? 'shipped' : undefined));
const designs = wanted.length === 0 ? everyDesign : everyDesign.filter((d) => wanted.some((w) => d.id === w || d.id.startsWith(`${w}:`)));
if (designs.length === 0) {
  console.error(`--designs: none of ${wanted.join(', ')} is one of ${everyDesign.map((d) => d.id).join(', ')}`);
  process.exit(2);
}
// 500/s is the issue's rate; the lower one shows rejections (and checks the 429 path) on a machine where the server answers slower than 500/s.
const limiterRates = opt['no-limiter'] ? [] : list(opt['limiter-rates'] ?? (quick ? '100' : '500,100')).map(Number);
if (!limiterRates.every((n) => Number.isInteger(n) && n > 0)) {
  console.error('--limiter-rates takes positive integers, e.g. 500,100');
  process.exit(2);
}
const plan: [Scenario, Design][] = [
  ...designs.map((d): [Scenario, Design] => [THROUGHPUT, d]),
  ...limiterRates.flatMap((rate) =>
    designs.filter((d) => d.id.startsWith('shipped')).map((d): [Scenario, Design] => [limiterScenario(rate), d]),
  ),
];

async function mariadbVersion(): Promise<string> {
  const c = loadConfig({ ...process.env, DB_NAME: 'mysql' });
  const conn = await mysql.createConnection({ host: c.DB_HOST, port: c.DB_PORT, user: c.DB_USER, password: c.DB_PASSWORD });
  try {
    const [rows] = (await conn.query('SELECT VERSION() AS v')) as unknown as [{ v: string }[]];
    return rows[0].v;
  } finally {
    await conn.end();
  }
}

const wrkSeconds = Number.parseInt(opt['wrk-seconds'] as string, 10);
const wrkUsers = Number.parseInt(opt['wrk-users'] as string, 10);
if (!(wrkSeconds > 0 && wrkUsers > 0)) {
  console.error('--wrk-seconds and --wrk-users take positive integers');
  process.exit(2);
}
// Optional: without wrk on the machine the benchmark runs with its own generator only, and says so.
const useWrk = !quick && opt['no-wrk'] !== true && wrkAvailable();
if (!quick && opt['no-wrk'] !== true && !useWrk) console.log('wrk is not installed (apt-get install wrk): the Node load generator only.');

const loadAvg = () => Math.round(os.loadavg()[0] * 100) / 100;

function users(prefix: string, n: number, secret: string): Shot[] {
  return Array.from({ length: n }, (_, i) => {
    const userId = `${prefix}-u${i}`;
    return { userId, key: `${prefix}-k${i}`, authorization: `Bearer ${signToken(secret, userId, [], 4 * 3600)}` };
  });
}

async function measure(): Promise<Report> {
  const startLoad = loadAvg();
  const jwtSecret = `bench-${Math.random().toString(36).slice(2)}-${Date.now()}`;
  console.log(
    `flash-sale bench${quick ? ' --quick' : ''}: ${grabs} grabs, ${stock} stock, ${connections} connections; signing ${grabs + warmupGrabs + (useWrk ? wrkUsers : 0)} tokens...`,
  );
  const workload: Workload = {
    grabs: users('fs', grabs, jwtSecret),
    warmup: users('warm', warmupGrabs, jwtSecret),
    stock,
    connections,
    jwtSecret,
    adminAuthorization: `Bearer ${signToken(jwtSecret, 'bench-admin', ['admin'], 4 * 3600)}`,
    keepDatabases: opt['keep-db'] === true,
    wrk: useWrk
      ? {
          seconds: wrkSeconds,
          connections,
          users: designs.some((d) => d.kind === 'grab') ? users('wrk', wrkUsers, jwtSecret) : [],
        }
      : undefined,
  };

  const runs: RunResult[] = [];
  const errors: string[] = [];
  // Each round runs the whole plan again, starting one step further along it, so that neither a burst
  // of other work on the machine nor the position in the order favours one design.
  const schedule = Array.from({ length: rounds }, (_, round) => {
    const start = round % plan.length;
    return [...plan.slice(start), ...plan.slice(0, start)].map(([scenario, design]) => ({ round: round + 1, scenario, design }));
  }).flat();
  for (const [i, { round, scenario, design }] of schedule.entries()) {
    const database = `ce_bench_${process.pid}_${i}_${design.id.replace(/[^A-Za-z0-9]/g, '_')}`.slice(0, 64);
    console.log(
      `[${i + 1}/${schedule.length}] ${rounds > 1 ? `round ${round}: ` : ''}${scenario.title} / ${design.id} (${design.title}) ...`,
    );
    try {
      const r = { ...(await runDesign(design, scenario, workload, database)), ...(rounds > 1 ? { round } : {}) };
      runs.push(r);
      const lat = r.latencyMs.SUCCESS;
      console.log(
        `    ${r.answeredPerSecond} answered/s, ${r.issuedPerSecond ?? '–'} issued/s, success p99 ${lat?.p99 ?? '–'} ms, ${JSON.stringify(r.counts)}, CPU ms/answer server ${r.cpu.serverMsPerAnswer}, database ${r.cpu.databaseMsPerAnswer ?? '–'}, generator ${r.cpu.loadGeneratorMsPerAnswer}, peak RSS ${r.memory.peakRssMiB} MiB, ` +
          `${r.connections.used} connections, ${r.violations.length === 0 ? 'checks pass' : `${r.violations.length} violations${r.failed ? ' (FAIL)' : ' (expected)'}`}`,
      );
      if (r.wrk)
        console.log(
          `    wrk: ${r.wrk.answeredPerSecond} answered/s, p50 / p99 ${r.wrk.latencyMs.p50} / ${r.wrk.latencyMs.p99} ms, ${JSON.stringify(r.wrk.counts)}, server CPU ${r.wrk.serverCpuMsPerAnswer} ms/answer, ` +
            `${r.wrk.violations.length === 0 ? 'checks pass' : `${r.wrk.violations.length} violations: ${r.wrk.violations.slice(0, 3).join('; ')}`}`,
        );
    } catch (err) {
      errors.push(`${scenario.id}/${design.id}: ${(err as Error).stack ?? String(err)}`);
      console.error(`    run failed: ${(err as Error).message}`);
    }
  }

  const machine: Machine = {
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model.trim() ?? 'unknown',
    memoryGiB: Math.round((os.totalmem() / 1024 ** 3) * 10) / 10,
    os: `${os.type()} ${os.release()}`,
    node: process.version,
    mariadb: await mariadbVersion(),
    loadAverage: { atStart: startLoad, atEnd: loadAvg() },
  };
  const args = process.argv.slice(2);
  return {
    benchmark: 'flash-sale',
    generatedAt: new Date().toISOString(),
    command: `npm run bench${args.length > 0 ? ` -- ${args.join(' ')}` : ''}`,
    quick,
    machine,
    workload: { grabs, stock, perUserLimit: 1, connections, warmupGrabs, rounds, dbPoolSize: process.env.DB_POOL_SIZE ?? '20 (default)' },
    runs,
    errors,
    failed: errors.length > 0 || runs.some((r) => r.failed),
  };
}

// --from-json re-renders the tables of a saved run (after a change to the report's layout) without measuring again.
const fromJson = opt['from-json'];
const report: Report = fromJson ? (JSON.parse(readFileSync(fromJson, 'utf8')) as Report) : await measure();
const markdown = toMarkdown(report);
console.log(`\n${markdown}`);

if (!quick) {
  mkdirSync(opt.out as string, { recursive: true });
  if (!fromJson) writeFileSync(`${opt.out}/flash-sale.json`, `${JSON.stringify(report, null, 2)}\n`);
  writeFileSync(`${opt.out}/flash-sale.md`, `# Flash-sale benchmark\n\n${markdown}\n`);
  updateBenchmarksMd('flash-sale', 'npm run bench', markdown);
  console.log(`written: ${fromJson ? '' : `${opt.out}/flash-sale.json, `}${opt.out}/flash-sale.md, BENCHMARKS.md`);
}
if (report.failed) {
  for (const e of report.errors) console.error(`\n${e}`);
  console.error('\n*** FLASH-SALE BENCHMARK FAILED: see the violations and errors above. ***');
  process.exitCode = 1;
} else {
  console.log('\nAll checks passed.');
}
