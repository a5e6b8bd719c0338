import { READ_THEN_WRITE } from './designs.js';
import type { RunResult } from './run-design.js';
import type { Latency } from './stats.js';

export interface Machine {
  cpus: number;
  cpuModel: string;
  memoryGiB: number;
  os: string;
  node: string;
  mariadb: string;
  /** 1-minute load average when the benchmark started and ended: other work on the machine shows here. */
  loadAverage: { atStart: number; atEnd: number };
}

export interface Report {
  benchmark: 'flash-sale';
  generatedAt: string;
  command: string;
  quick: boolean;
  machine: Machine;
  workload: { grabs: number; stock: number; perUserLimit: 1; connections: number; warmupGrabs: number; rounds: number; dbPoolSize: string };
  runs: RunResult[];
  /** Runs that did not complete (a server that did not start, a crash): each one fails the benchmark. */
  errors: string[];
  failed: boolean;
}

const num = (x: number | null | undefined, digits = 0) =>
  x === null || x === undefined ? '–' : x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
const ratio = (x: number | null | undefined, base: number | null | undefined) => (x && base ? `${(x / base).toFixed(2)}×` : '–');
const lat = (l: Latency | undefined) => (l ? `${num(l.p50, 1)} / ${num(l.p99, 1)} / ${num(l.p999, 1)} / ${num(l.max, 1)}` : '–');
const checks = (r: RunResult) =>
  r.violations.length === 0
    ? r.design === READ_THEN_WRITE.id
      ? 'pass (no oversell this run)'
      : 'pass'
    : `${r.failed ? '**FAIL**' : 'violated (expected)'}: ${r.violations.length}`;

/** Of several rounds of one design, the run with the median answered/s (all of them are in the JSON, and all are checked). */
function medians(runs: readonly RunResult[]): RunResult[] {
  const groups = new Map<string, RunResult[]>();
  for (const r of runs) {
    const key = `${r.scenario}/${r.design}/${r.limiter?.ratePerSecond ?? ''}`;
    groups.set(key, [...(groups.get(key) ?? []), r]);
  }
  return [...groups.values()].map((g) => [...g].sort((a, b) => a.answeredPerSecond - b.answeredPerSecond)[Math.floor((g.length - 1) / 2)]);
}

/** The runs as markdown tables; every ratio compares runs made in this same invocation. */
export function toMarkdown(rep: Report): string {
  const shown = medians(rep.runs);
  const thr = shown.filter((r) => r.scenario === 'throughput');
  const lim = shown.filter((r) => r.scenario === 'limiter');
  const shipped = thr.find((r) => r.design.startsWith('shipped'));
  const noop = thr.find((r) => r.design === 'noop');
  const m = rep.machine;
  const w = rep.workload;
  const used = rep.runs.map((r) => r.connections.used);
  const inFlight = Math.max(0, ...rep.runs.map((r) => r.connections.maxInFlight));
  const out: string[] = [
    `Flash sale: ${num(w.grabs)} grabs by ${num(w.grabs)} distinct users (own token and Idempotency-Key each) on one coupon with ${num(w.stock)} stock, limit 1 per user, ` +
      `over ${num(w.connections)} keep-alive connections (measured: ${used.length > 0 ? `${num(Math.min(...used))}–${num(Math.max(...used))}` : '–'} connections used per run, up to ${num(inFlight)} requests in flight at once); ` +
      `${num(w.warmupGrabs)} warm-up grabs on another coupon first. Each run: its own server process and fresh database (DB pool ${w.dbPoolSize}).` +
      (w.rounds > 1
        ? ` The plan ran ${w.rounds} times over; each row is the round with the median answered/s, and every round passed the same checks.`
        : ''),
    '',
    `Command: \`${rep.command}\` · ${rep.generatedAt} · ${m.cpus} × ${m.cpuModel}, ${m.memoryGiB} GiB, ${m.os}, Node ${m.node}, MariaDB ${m.mariadb}, ` +
      `load average ${m.loadAverage.atStart} at start, ${m.loadAverage.atEnd} at end.`,
    '',
  ];
  if (thr.length > 0) {
    out.push(
      '### Rate limiter off',
      '',
      '| design | answered/s | vs shipped | of no-op ceiling | issued/s | vs shipped | last coupon at s | issued | oversold | stock left | server CPU ms/answer | peak RSS MiB | checks |',
      '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|',
      ...thr.map(
        (r) =>
          `| ${r.design}: ${r.title} | ${num(r.answeredPerSecond)} | ${ratio(r.answeredPerSecond, shipped?.answeredPerSecond)} | ${noop ? `${Math.round((r.answeredPerSecond / noop.answeredPerSecond) * 100)}%` : '–'} | ` +
          `${num(r.issuedPerSecond)} | ${ratio(r.issuedPerSecond, shipped?.issuedPerSecond)} | ${num(r.lastSuccessAtMs && r.lastSuccessAtMs / 1000, 2)} | ${num(r.verification?.issued)} | ${num(r.verification?.oversold)} | ${num(r.verification?.stockLeft)} | ${num(r.cpu.serverMsPerAnswer, 2)} | ${num(r.memory.peakRssMiB)} | ${checks(r)} |`,
      ),
      ...(thr.some((r) => r.design === READ_THEN_WRITE.id)
        ? [
            '',
            `${READ_THEN_WRITE.id} oversells only when grabs interleave between its read and its write as the last units go, so how many varies from run to run and can be 0; ` +
              'the other designs must show 0 every time, and any violation of theirs fails the run.',
          ]
        : []),
      '',
      'Latency in ms, p50 / p99 / p99.9 / max, by answer (a percentile over mixed answers hides the slow ones):',
      '',
      '| design | successes (n) | success latency | SOLD_OUT (n) | SOLD_OUT latency | other answers |',
      '|---|--:|---|--:|---|---|',
      ...thr.map((r) => latencyRow(r, ['SUCCESS', 'SOLD_OUT'])),
      ...(thr.some((r) => r.design === 'page' || r.design === 'list')
        ? ['', 'page and list are reads (GET, no token): their 200s are counted as successes.']
        : []),
      '',
    );
  }
  if (lim.length > 0) {
    out.push(
      '### Rate limiter on (per-coupon token bucket, in-memory)',
      '',
      '| design | rate/s | admitted | rejected (429) | admissible at most | issued | answered/s | RATE_LIMITED latency | success latency | peak RSS MiB | checks |',
      '|---|--:|--:|--:|--:|--:|--:|---|---|--:|---|',
      ...lim.map(
        (r) =>
          `| ${r.design} | ${num(r.limiter?.ratePerSecond)} | ${num(r.limiter?.admitted)} | ${num(r.limiter?.rejected)} | ${num(r.limiter?.admissibleAtMost)} | ${num(r.verification?.issued)} | ${num(r.answeredPerSecond)} | ` +
          `${lat(r.latencyMs.RATE_LIMITED)} | ${lat(r.latencyMs.SUCCESS)} | ${num(r.memory.peakRssMiB)} | ${checks(r)} |`,
      ),
      '',
      'A bucket of R/s admits at most R × (1 + seconds of the run); it can only reject when grabs arrive faster than R/s, so with no rejections the server itself was slower than the limit.',
      '',
    );
  }
  out.push(...wrkTable(thr), ...strategyRounds(rep.runs), ...grabPhaseRounds(rep.runs), ...publicReadRounds(rep.runs));
  const failing = rep.runs.filter((r) => r.violations.length > 0);
  if (failing.length > 0) {
    out.push('### Violations', '');
    for (const r of failing)
      out.push(
        `- ${r.scenario}/${r.design}${r.round ? ` (round ${r.round})` : ''}${r.failed ? ' (FAILS THE RUN)' : ' (expected of this design)'}:`,
        ...r.violations.slice(0, 10).map((v) => `  - ${v}`),
      );
    out.push('');
  }
  return out.join('\n');
}

function latencyRow(r: RunResult, main: string[]): string {
  const other = Object.entries(r.counts)
    .filter(([c]) => !main.includes(c))
    .map(([c, n]) => `${c} ${num(n)}`)
    .join(', ');
  return `| ${r.design} | ${num(r.counts.SUCCESS ?? 0)} | ${lat(r.latencyMs.SUCCESS)} | ${num(r.counts.SOLD_OUT ?? 0)} | ${lat(r.latencyMs.SOLD_OUT)} | ${other || '–'} |`;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
};

/** The limiter-off runs round by round, each with a lookup of that round's run of a design. */
function throughputRounds(runs: readonly RunResult[]): { round: number; at: (design: string) => RunResult | undefined }[] {
  const thr = runs.filter((r) => r.scenario === 'throughput');
  const rounds = [...new Set(thr.map((r) => r.round ?? 1))].sort((a, b) => a - b);
  return rounds.map((round) => ({ round, at: (design) => thr.find((r) => r.design === design && (r.round ?? 1) === round) }));
}

/**
 * Issue 9's goals, as ratios of runs made in the same round (so the same machine moment), and their
 * median over the rounds: one round's figures can be moved by other work on a shared machine.
 */
function strategyRounds(runs: readonly RunResult[]): string[] {
  const rows = throughputRounds(runs).flatMap(({ round, at }) => {
    const [g, p, n] = [at('shipped:grouped'), at('shipped:per-request'), at('noop')];
    const gp99 = g?.latencyMs.SUCCESS?.p99;
    const pp99 = p?.latencyMs.SUCCESS?.p99;
    if (!g || !p || !gp99 || !pp99) return [];
    return [
      {
        round,
        g,
        p,
        gp99,
        pp99,
        speedup: g.answeredPerSecond / p.answeredPerSecond,
        ofNoop: n ? g.answeredPerSecond / n.answeredPerSecond : null,
        p99Ratio: gp99 / pp99,
      },
    ];
  });
  if (rows.length === 0) return [];
  const ofNoop = rows.flatMap((r) => (r.ofNoop === null ? [] : [r.ofNoop]));
  return [
    '### Grouped vs per-request, round by round (issue 9)',
    '',
    '| round | grouped answered/s | per-request answered/s | grouped ÷ per-request (goal ≥ 5) | grouped ÷ no-op (goal ≥ 0.5) | success p99 grouped / per-request, ms | p99 ratio (goal ≤ 0.2) |',
    '|--:|--:|--:|--:|--:|--:|--:|',
    ...rows.map(
      (r) =>
        `| ${r.round} | ${num(r.g.answeredPerSecond)} | ${num(r.p.answeredPerSecond)} | ${r.speedup.toFixed(2)} | ${r.ofNoop === null ? '–' : r.ofNoop.toFixed(2)} | ${num(r.gp99, 1)} / ${num(r.pp99, 1)} | ${r.p99Ratio.toFixed(3)} |`,
    ),
    ...(rows.length > 1
      ? [
          `| median | | | ${median(rows.map((r) => r.speedup)).toFixed(2)} | ${ofNoop.length > 0 ? median(ofNoop).toFixed(2) : '–'} | | ${median(rows.map((r) => r.p99Ratio)).toFixed(3)} |`,
        ]
      : []),
    '',
  ];
}

/**
 * Where the grouped grab's gap to the no-op lies (issue 22's 0.9× goal): its answers per second while
 * coupons are left and after the sell-out, each against the no-op route of the same round.
 */
function grabPhaseRounds(runs: readonly RunResult[]): string[] {
  const rows = throughputRounds(runs).flatMap(({ round, at }) => {
    const [g, n, ahead] = [at('shipped:grouped') ?? at('shipped'), at('noop'), at('noop:ahead')];
    return g?.phases && n ? [{ round, g, n, phases: g.phases, noop: n.answeredPerSecond, ahead: ahead?.answeredPerSecond ?? null }] : [];
  });
  if (rows.length === 0) return [];
  const ratio = (x: number | null, noop: number) => (x === null ? null : x / noop);
  const cells = rows.map((r) => ({
    ...r,
    whole: r.g.answeredPerSecond / r.noop,
    sale: r.phases.salePerSecond / r.noop,
    soldOut: ratio(r.phases.soldOutPerSecond, r.noop),
    wholeAhead: r.ahead === null ? null : r.g.answeredPerSecond / r.ahead,
  }));
  const med = (xs: (number | null)[]) => {
    const v = xs.filter((x): x is number => x !== null);
    return v.length > 0 ? median(v).toFixed(2) : '–';
  };
  return [
    '### The grouped grab in its two phases against the no-op, round by round (issue 22)',
    '',
    "The sale: answers from the first grab to the last coupon issued, every grab decided in a group transaction. Sold out: answers to the grabs sent after the last coupon was answered, over the time from then to the end, refused from memory after one batched key lookup. The last group's own refusals (sent before, answered just after the last coupon) count in neither.",
    '',
    "The grab is answered ahead of Fastify, in the server's own request listener, and the no-op is not; the last column sets it against the no-op answered the same way (noop:ahead), the ceiling of what the grab skips.",
    '',
    '| round | no-op answered/s | sale answered/s | sale ÷ no-op | sold-out answered/s | sold-out ÷ no-op | whole run ÷ no-op (goal ≥ 0.9) | no-op ahead of Fastify answered/s | whole run ÷ no-op ahead of Fastify |',
    '|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
    ...cells.map(
      (c) =>
        `| ${c.round} | ${num(c.noop)} | ${num(c.phases.salePerSecond)} | ${c.sale.toFixed(2)} | ${num(c.phases.soldOutPerSecond)} | ${c.soldOut === null ? '–' : c.soldOut.toFixed(2)} | ${c.whole.toFixed(2)} | ${num(c.ahead)} | ${c.wholeAhead === null ? '–' : c.wholeAhead.toFixed(2)} |`,
    ),
    ...(cells.length > 1
      ? [
          `| median | | | ${med(cells.map((c) => c.sale))} | | ${med(cells.map((c) => c.soldOut))} | ${med(cells.map((c) => c.whole))} | | ${med(cells.map((c) => c.wholeAhead))} |`,
        ]
      : []),
    '',
    ...cpuRounds(rows),
  ];
}

/**
 * The machine's CPU per answer by process, grouped grab against the no-op, from the same round. The
 * load generator, the server and the database share the cores, so on a CPU-bound run the
 * answered/s ratio follows the ratio of the totals, and that ratio moves far less than wall-clock
 * figures with the machine's other load.
 */
function cpuRounds(rows: readonly { round: number; g: RunResult; n: RunResult }[]): string[] {
  const cells = rows.flatMap(({ round, g, n }) => {
    // Runs saved before these figures were measured have none.
    const db = g.cpu.databaseMsPerAnswer ?? null;
    if (db === null || g.cpu.loadGeneratorMsPerAnswer === undefined || n.cpu.loadGeneratorMsPerAnswer === undefined) return [];
    const grab = g.cpu.serverMsPerAnswer + db + g.cpu.loadGeneratorMsPerAnswer;
    const noop = n.cpu.serverMsPerAnswer + (n.cpu.databaseMsPerAnswer ?? 0) + n.cpu.loadGeneratorMsPerAnswer;
    return [{ round, g: g.cpu, n: n.cpu, grab, noop, ratio: noop / grab }];
  });
  if (cells.length === 0) return [];
  const ms = (x: number | null) => (x === null ? '–' : x.toFixed(3));
  return [
    "CPU per answer by process during the timed part, ms (server, local database server, this load generator; they share the machine's cores):",
    '',
    '| round | grouped: server | database | generator | total | no-op: server | database | generator | total | no-op total ÷ grouped total |',
    '|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
    ...cells.map(
      (c) =>
        `| ${c.round} | ${ms(c.g.serverMsPerAnswer)} | ${ms(c.g.databaseMsPerAnswer)} | ${ms(c.g.loadGeneratorMsPerAnswer)} | ${ms(c.grab)} | ` +
        `${ms(c.n.serverMsPerAnswer)} | ${ms(c.n.databaseMsPerAnswer)} | ${ms(c.n.loadGeneratorMsPerAnswer)} | ${ms(c.noop)} | ${c.ratio.toFixed(2)} |`,
    ),
    ...(cells.length > 1 ? [`| median | | | | | | | | | ${median(cells.map((c) => c.ratio)).toFixed(2)} |`] : []),
    '',
  ];
}

/**
 * Issue 22's goals for the public reads, from runs of the same round: the coupon page and the list
 * against the grouped grab's answered/s and the no-op route's, and their p99 against the no-op's.
 */
function publicReadRounds(runs: readonly RunResult[]): string[] {
  const rows = throughputRounds(runs).flatMap(({ round, at }) => {
    const [g, n] = [at('shipped:grouped') ?? at('shipped'), at('noop')];
    return (['page', 'list'] as const).flatMap((id) => {
      const r = at(id);
      const p99 = r?.latencyMs.SUCCESS?.p99;
      const noopP99 = n?.latencyMs.SUCCESS?.p99;
      if (!r || !p99) return [];
      return [
        {
          round,
          id,
          r,
          p99,
          noopP99,
          ofGrab: g ? r.answeredPerSecond / g.answeredPerSecond : null,
          ofNoop: n ? r.answeredPerSecond / n.answeredPerSecond : null,
          p99Ratio: noopP99 ? p99 / noopP99 : null,
          wrkOfGrab: r.wrk && g?.wrk ? r.wrk.answeredPerSecond / g.wrk.answeredPerSecond : null,
          wrkOfNoop: r.wrk && n?.wrk ? r.wrk.answeredPerSecond / n.wrk.answeredPerSecond : null,
          wrkP99Ratio: r.wrk && n?.wrk ? r.wrk.latencyMs.p99 / n.wrk.latencyMs.p99 : null,
        },
      ];
    });
  });
  if (rows.length === 0) return [];
  const fixed = (x: number | null, d = 2) => (x === null ? '–' : x.toFixed(d));
  const medianOf = (id: string, f: (r: (typeof rows)[number]) => number | null) => {
    const xs = rows.filter((r) => r.id === id).flatMap((r) => (f(r) === null ? [] : [f(r) as number]));
    return xs.length > 0 ? median(xs) : null;
  };
  return [
    '### Public coupon page and list vs the grab and the no-op route, round by round (issue 22)',
    '',
    '| round | route | answered/s | ÷ grouped grab (goal ≥ 1.5) | ÷ no-op (goal ≥ 0.9) | p99 / no-op p99, ms | p99 ratio (goal < 1.5) | server CPU ms/answer | wrk: ÷ grab | wrk: ÷ no-op | wrk: p99 ratio |',
    '|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
    ...rows.map(
      (r) =>
        `| ${r.round} | ${r.id} | ${num(r.r.answeredPerSecond)} | ${fixed(r.ofGrab)} | ${fixed(r.ofNoop)} | ${num(r.p99, 1)} / ${num(r.noopP99, 1)} | ${fixed(r.p99Ratio)} | ${num(r.r.cpu.serverMsPerAnswer, 3)} | ` +
        `${fixed(r.wrkOfGrab)} | ${fixed(r.wrkOfNoop)} | ${fixed(r.wrkP99Ratio)} |`,
    ),
    ...(new Set(rows.map((r) => r.round)).size > 1
      ? (['page', 'list'] as const).map(
          (id) =>
            `| median | ${id} | | ${fixed(medianOf(id, (r) => r.ofGrab))} | ${fixed(medianOf(id, (r) => r.ofNoop))} | | ${fixed(medianOf(id, (r) => r.p99Ratio))} | | ` +
            `${fixed(medianOf(id, (r) => r.wrkOfGrab))} | ${fixed(medianOf(id, (r) => r.wrkOfNoop))} | ${fixed(medianOf(id, (r) => r.wrkP99Ratio))} |`,
        )
      : []),
    ...(rows.some((r) => r.wrkOfNoop !== null)
      ? ['', "The wrk columns: the same ratios from wrk's run on the same servers (its p99 is over every answer of the route)."]
      : []),
    '',
  ];
}

/** The second load generator's figures (wrk, in C), run on the same server right after the Node generator's. */
function wrkTable(thr: readonly RunResult[]): string[] {
  const runs = thr.filter((r) => r.wrk);
  if (runs.length === 0) return [];
  const first = runs[0].wrk as NonNullable<RunResult['wrk']>;
  const base = (id: string) => runs.find((r) => r.design === id || (id === 'shipped:grouped' && r.design === 'shipped'))?.wrk;
  const [g, n] = [base('shipped:grouped'), base('noop')];
  return [
    `### The same designs under wrk (second load generator: ${num(first.connections)} connections, ${first.seconds} s, 2 threads)`,
    '',
    "Each server, right after the Node generator's timed part: wrk for a fixed time (grabs on a new coupon of the same stock, each request a new pre-signed user and key; reads and the no-op the same request each time). Latency is over all answers.",
    '',
    '| design | answered/s | ÷ grouped | ÷ no-op | Node generator answered/s (same server) | p50 / p90 / p99 / max ms | answers | server CPU ms/answer | checks |',
    '|---|--:|--:|--:|--:|---|---|--:|---|',
    ...runs.map((r) => {
      const k = r.wrk as NonNullable<RunResult['wrk']>;
      const l = k.latencyMs;
      const answers = Object.entries(k.counts)
        .map(([c, x]) => `${c} ${num(x)}`)
        .join(', ');
      const ok = k.violations.length === 0 ? 'pass' : `${r.failed ? '**FAIL**' : 'violated (expected)'}: ${k.violations.length}`;
      return (
        `| ${r.design} | ${num(k.answeredPerSecond)} | ${ratio(k.answeredPerSecond, g?.answeredPerSecond)} | ${ratio(k.answeredPerSecond, n?.answeredPerSecond)} | ${num(r.answeredPerSecond)} | ` +
        `${num(l.p50, 1)} / ${num(l.p90, 1)} / ${num(l.p99, 1)} / ${num(l.max, 1)} | ${answers} | ${num(k.serverCpuMsPerAnswer, 3)} | ${ok} |`
      );
    }),
    '',
  ];
}
