import { execFile, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BROWSER_ACCEPT_ENCODING, type Shot } from './load.js';

/** What one wrk run measured; latency is over every answer (wrk does not split it by class). */
export interface WrkResult {
  connections: number;
  seconds: number;
  requests: number;
  answeredPerSecond: number;
  latencyMs: { p50: number; p90: number; p99: number; max: number };
  /** Answers by class, counted by the script: SUCCESS, SOLD_OUT, HTTP_<status>. */
  counts: Record<string, number>;
  /** wrk's socket errors: connect, read, write, timeout (no answer within --timeout). */
  errors: Record<string, number>;
  /** More requests were sent than users were signed: keys repeated. */
  wrapped: boolean;
  serverCpuMsPerAnswer: number;
}

/** wrk (the Debian package) as the benchmark's second load generator, when it is installed. */
export function wrkAvailable(): boolean {
  return spawnSync('wrk', ['--version'], { stdio: 'ignore' }).error === undefined;
}

const THREADS = 2;

/**
 * Runs wrk against `url + path` for `seconds` over `connections` connections (closed loop, like
 * the Node generator). Grabs take a new pre-signed user per request from `users`; reads and the
 * no-op send the same request each time.
 */
export async function runWrk(opts: {
  url: string;
  path: string;
  method: 'GET' | 'POST';
  connections: number;
  seconds: number;
  users?: readonly Shot[];
  authorization?: string;
  serverCpuSeconds: () => number;
}): Promise<WrkResult> {
  const dir = mkdtempSync(join(tmpdir(), 'bench-wrk-'));
  try {
    const lines = opts.users ? join(dir, 'users.tsv') : '';
    if (opts.users) writeFileSync(lines, opts.users.map((u) => `${u.authorization}\t${u.key}\n`).join(''));
    const cpuBefore = opts.serverCpuSeconds();
    const args = [
      `-t${THREADS}`,
      `-c${opts.connections}`,
      `-d${opts.seconds}s`,
      // wrk's default of 2 s would count the slow end of a sale's burst as errors, not as latency.
      '--timeout',
      '30s',
      '-s',
      'bench/wrk/load.lua',
      `${opts.url}${opts.path}`,
      '--',
      opts.method,
      opts.path,
      lines,
      opts.authorization ?? '',
      String(THREADS),
      BROWSER_ACCEPT_ENCODING,
    ];
    const stdout = await new Promise<string>((resolve, reject) =>
      execFile('wrk', args, { maxBuffer: 16 * 1024 * 1024 }, (err, out, errOut) =>
        err ? reject(new Error(`wrk failed: ${err.message}\n${errOut}`)) : resolve(out),
      ),
    );
    const serverCpu = opts.serverCpuSeconds() - cpuBefore;
    const line = stdout.split('\n').find((l) => l.startsWith('WRK_RESULT '));
    if (!line) throw new Error(`wrk printed no result:\n${stdout}`);
    const r = JSON.parse(line.slice('WRK_RESULT '.length)) as {
      requests: number;
      durationUs: number;
      errors: Record<string, number>;
      latencyUs: { p50: number; p90: number; p99: number; max: number };
      classes: Record<string, number>;
      wrapped: boolean;
    };
    const ms = (us: number) => Math.round(us / 10) / 100;
    return {
      connections: opts.connections,
      seconds: opts.seconds,
      requests: r.requests,
      answeredPerSecond: Math.round((r.requests / r.durationUs) * 1e7) / 10,
      latencyMs: { p50: ms(r.latencyUs.p50), p90: ms(r.latencyUs.p90), p99: ms(r.latencyUs.p99), max: ms(r.latencyUs.max) },
      counts: r.classes,
      errors: r.errors,
      wrapped: r.wrapped,
      serverCpuMsPerAnswer: r.requests > 0 ? Math.round(((serverCpu * 1000) / r.requests) * 1000) / 1000 : 0,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
