import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { freePort } from '../../test/support/net.js';

export interface ServerSpec {
  /** The built entry to run, relative to the repository root: dist/src/main.js or dist/bench/reference-server.js. */
  entry: string;
  env: Record<string, string>;
}

export interface RunningServer {
  url: string;
  pid: number;
  /** VmHWM: the highest resident set size the process has had so far, in bytes. */
  peakRss(): number;
  rss(): number;
  /** User plus system CPU time the process has used so far, in seconds. */
  cpuSeconds(): number;
  stop(): Promise<void>;
}

/**
 * The node flags of `npm run start:prod` (`node <flags> dist/src/main.js`), so every design runs on
 * the runtime settings production uses.
 */
export function productionNodeArgs(): string[] {
  const pkg = JSON.parse(readFileSync('package.json', 'utf8')) as { scripts: Record<string, string> };
  // `exec node ...` (the shell hands its process over to node, so signals reach it) is still node.
  const words = pkg.scripts['start:prod'].replace(/^exec\s+/, '').split(/\s+/);
  if (words[0] !== 'node') throw new Error(`package.json start:prod should run node, not: ${pkg.scripts['start:prod']}`);
  return words.slice(1, -1);
}

function statusKiB(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${field}:`));
  return line ? Number(/(\d+)/.exec(line)?.[1] ?? 0) : 0;
}

const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** User plus system CPU time process `pid` has used so far, in seconds. */
export function cpuSeconds(pid: number): number {
  // Fields after the parenthesised command name; utime and stime are the 14th and 15th of the whole line.
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
}

/**
 * The process of the database server the benchmark uses, when it is on this machine: the one
 * listening on DB_PORT (the test suites start MariaDB servers of their own, so a name is not
 * enough), so a run can say how much of the shared CPU the database took. Null when DB_HOST is not
 * a loopback address or no local process listens there.
 */
export function localDatabasePid(host = process.env.DB_HOST ?? '127.0.0.1', port = process.env.DB_PORT ?? '3306'): number | null {
  if (!['127.0.0.1', 'localhost', '::1'].includes(host)) return null;
  try {
    const listening = execFileSync('ss', ['-Hltnp', `sport = :${port}`], { encoding: 'utf8' });
    const pid = Number(/pid=(\d+)/.exec(listening)?.[1]);
    return pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/** What the child printed last, for the error message when it dies or never becomes healthy. */
function tail(chunks: string[]): string {
  return chunks.join('').split('\n').slice(-20).join('\n');
}

/** Starts the server as its own process, the way production runs it, and waits for GET /health. */
export async function startServer(spec: ServerSpec, bootTimeoutMs = 90_000): Promise<RunningServer> {
  const port = await freePort();
  const output: string[] = [];
  // BENCH_SERVER_NODE_ARGS (e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof") profiles the server under load.
  const nodeArgs = [...productionNodeArgs(), ...(process.env.BENCH_SERVER_NODE_ARGS ?? '').split(' ').filter(Boolean)];
  const child: ChildProcess = spawn(process.execPath, [...nodeArgs, spec.entry], {
    env: { PATH: process.env.PATH ?? '', ...spec.env, PORT: String(port) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const keep = (b: Buffer) => {
    output.push(b.toString());
    if (output.length > 200) output.splice(0, 100);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  let exited: number | null = null;
  const exit = new Promise<void>((resolve) =>
    child.once('exit', (code, signal) => {
      exited = code ?? (signal ? 128 : 1);
      resolve();
    }),
  );
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + bootTimeoutMs;
  for (;;) {
    if (exited !== null) throw new Error(`${spec.entry} exited with ${exited} before it was healthy:\n${tail(output)}`);
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`${spec.entry} was not healthy within ${bootTimeoutMs} ms:\n${tail(output)}`);
    }
    const ok = await fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  const pid = child.pid as number;
  return {
    url,
    pid,
    peakRss: () => statusKiB(pid, 'VmHWM') * 1024,
    rss: () => statusKiB(pid, 'VmRSS') * 1024,
    cpuSeconds: () => cpuSeconds(pid),
    async stop() {
      if (exited !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exit;
      clearTimeout(timer);
    },
  };
}
