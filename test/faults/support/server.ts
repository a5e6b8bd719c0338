import { ChildProcess, execFile, spawn } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { TEST_SECRET } from '../../support/harness.js';
import { call, sleep } from './http.js';
import { freePort } from '../../support/net.js';

export const ROOT = fileURLToPath(new URL('../../..', import.meta.url)).replace(/\/$/, '');
/**
 * The fault tests run the service as the operator does (`node dist/src/main.js`), from a build of
 * their own: the shared dist/ is rebuilt by others at any moment. Under node_modules so that the
 * built code resolves its packages exactly as dist/ does.
 */
export const BUILD_DIR = join(ROOT, 'node_modules/.cache/coupon-engine-faults');
const MAIN = join(BUILD_DIR, 'src/main.js');
function newestMtime(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtime(path) : statSync(path).mtimeMs);
  }
  return newest;
}

/**
 * Compiles src/ into the private build directory unless it is newer than every source file. A type
 * error elsewhere in the tree (someone's work in progress) does not stop tsc from emitting, so the
 * build is used as long as main.js came out of it.
 */
export async function buildServer(): Promise<void> {
  const marker = join(BUILD_DIR, '.built');
  if (existsSync(marker) && statSync(marker).mtimeMs > newestMtime(join(ROOT, 'src'))) return;
  mkdirSync(BUILD_DIR, { recursive: true });
  const tsc = join(ROOT, 'node_modules/typescript/bin/tsc');
  try {
    await promisify(execFile)(process.execPath, [tsc, '-p', join(ROOT, 'tsconfig.build.json'), '--outDir', BUILD_DIR], {
      cwd: ROOT,
      maxBuffer: 16 * 1024 * 1024,
    });
  } catch (err) {
    if (!existsSync(MAIN)) throw err;
    console.warn(`tsc reported errors, using what it emitted: ${String((err as { stdout?: string }).stdout ?? err).slice(0, 2000)}`);
  }
  // Outside the project's package.json scope (node_modules), the build must say it is ESM itself.
  writeFileSync(join(BUILD_DIR, 'package.json'), JSON.stringify({ type: 'module' }));
  writeFileSync(marker, new Date().toISOString());
}

/** Six-field cron expression (UTC) that fires once, at the second `at` falls in. */
export const cronAt = (at: Date) => `${at.getUTCSeconds()} ${at.getUTCMinutes()} ${at.getUTCHours()} * * *`;

export interface ServerOptions {
  dbName: string;
  dbUser?: string;
  dbPassword?: string;
  /** Reuse a port, e.g. to restart "the same" server after a crash. */
  port?: number;
  /** Session innodb_lock_wait_timeout for the app's pool connections, in seconds. */
  lockWaitTimeout?: number;
  env?: Record<string, string>;
}

export interface Server {
  url: string;
  port: number;
  child: ChildProcess;
  logFile: string;
  /** kill -9: no shutdown hooks, no graceful close of anything. */
  crash(): Promise<void>;
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

const exited = (child: ChildProcess) =>
  child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise<void>((ok) => child.once('exit', () => ok()));

let serverSeq = 0;

/** Starts `node <build>/src/main.js` on its own port and waits for /health. */
export async function startServer(opts: ServerOptions): Promise<Server> {
  const port = opts.port ?? (await freePort());
  const logFile = join('/tmp', `coupon-engine-faults-${opts.dbName}-${++serverSeq}.log`);
  const env = {
    PATH: process.env.PATH ?? '',
    NODE_ENV: 'test',
    PORT: String(port),
    DB_HOST: process.env.DB_HOST ?? '127.0.0.1',
    DB_PORT: process.env.DB_PORT ?? '3306',
    DB_USER: opts.dbUser ?? process.env.DB_USER ?? 'root',
    DB_PASSWORD: opts.dbPassword ?? process.env.DB_PASSWORD ?? '',
    DB_NAME: opts.dbName,
    DB_POOL_SIZE: '20',
    JWT_SECRET: TEST_SECRET,
    LOG_LEVEL: 'warn',
    SCHEDULER_ENABLED: 'false',
    WEBHOOK_RELAY_ENABLED: 'false',
    RATE_LIMIT_ENABLED: 'false',
    ...(opts.lockWaitTimeout !== undefined ? { DB_LOCK_WAIT_TIMEOUT_SECONDS: String(opts.lockWaitTimeout) } : {}),
    ...opts.env,
  };
  const child = spawn(process.execPath, [MAIN], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  child.once('exit', () => running.delete(child));
  const log = createWriteStream(logFile);
  child.stdout?.pipe(log);
  child.stderr?.pipe(log);
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null)
      throw new Error(`server exited with ${child.exitCode} during start; log ${logFile}:\n${readFileSync(logFile, 'utf8').slice(-3000)}`);
    const health = await call(url, 'GET', '/health', { timeoutMs: 2000 });
    if (health.status === 200) break;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`server not healthy after 60 s; log ${logFile}`);
    }
    await sleep(100);
  }
  return {
    url,
    port,
    child,
    logFile,
    async crash() {
      child.kill('SIGKILL');
      await exited(child);
    },
    async stop() {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      await exited(child);
      clearTimeout(timer);
    },
  };
}
