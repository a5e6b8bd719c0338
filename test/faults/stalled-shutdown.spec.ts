import { readFileSync } from 'node:fs';
import { startStallProxy, StallProxy } from '../support/stall-proxy.js';
import { createFaultDatabase, FaultDatabase } from './support/db.js';
import { sleep } from './support/http.js';
import { buildServer, Server, startServer } from './support/server.js';

/**
 * SIGTERM while the database is partitioned away (connections open, nothing answers): no cron job
 * starts a run after the signal, the stop ends within SHUTDOWN_TIMEOUT_MS (exit 1, naming what it
 * still waited for) rather than after every stalled statement's timeout (30 s each), and a second
 * signal exits at once. With the database refusing connections instead, the stop stays prompt and
 * graceful.
 */

/** Scheduling slack on a loaded 2-core machine. */
const SLACK_MS = 2500;
const SHUTDOWN_TIMEOUT_MS = 6000;

interface LogLine {
  time: string;
  level: number;
  msg: string;
}

const linesOf = (server: Server): LogLine[] =>
  readFileSync(server.logFile, 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as LogLine);

/** The first log line after `from` (an index into the lines) that matches, once it is written. */
async function lineAfter(server: Server, from: number, pattern: RegExp, withinMs = 30_000): Promise<{ line: LogLine; at: number }> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    const lines = linesOf(server);
    const at = lines.findIndex((l, i) => i >= from && pattern.test(l.msg));
    if (at >= 0) return { line: lines[at], at };
    if (Date.now() > deadline) throw new Error(`no log line ${pattern} within ${withinMs} ms; log ${server.logFile}`);
    await sleep(50);
  }
}

const exitOf = (server: Server) =>
  new Promise<{ code: number | null; at: number }>((ok) => {
    if (server.child.exitCode !== null) ok({ code: server.child.exitCode, at: Date.now() });
    else server.child.once('exit', (code) => ok({ code, at: Date.now() }));
  });

describe('SIGTERM with the database stalled', () => {
  let fdb: FaultDatabase;
  let proxy: StallProxy;
  let server: Server | undefined;

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
  });
  beforeEach(async () => {
    proxy = await startStallProxy({ host: fdb.config.DB_HOST, port: fdb.config.DB_PORT });
  });
  afterEach(async () => {
    if (server && server.child.exitCode === null && server.child.signalCode === null) await server.crash();
    server = undefined;
    proxy.resume();
    await proxy.close();
  });
  afterAll(async () => {
    await fdb?.close();
  });

  /**
   * With the hold sweep every second, 1.5 s into the stall one of its runs is stuck: one that began
   * after the stall, or one the stall caught midway (which holds the next ones back: a wait for a
   * run beginning after the stall then timed out on a loaded machine).
   */
  const holdSweepStuck = () => sleep(1500);

  const start = (env: Record<string, string>) =>
    startServer({
      dbName: fdb.name,
      env: {
        DB_HOST: '127.0.0.1',
        DB_PORT: String(proxy.port),
        SCHEDULER_ENABLED: 'true',
        // Its loop would be one more thing stuck on the database, before the jobs in Nest's order.
        BULK_RUNNER_ENABLED: 'false',
        LOG_LEVEL: 'debug',
        LOG_FORMAT: 'json',
        ...env,
      },
    });

  it('no cron job starts after the signal; the stop ends within SHUTDOWN_TIMEOUT_MS, exit 1, naming what it still waited for', async () => {
    // The hold sweep every second, so one is stuck at the signal; its module stops before the expiry
    // sweep's, which is between runs at the signal and due during the stop.
    server = await start({ HOLD_SWEEP_SECONDS: '1', EXPIRE_CRON: '*/5 * * * * *', SHUTDOWN_TIMEOUT_MS: String(SHUTDOWN_TIMEOUT_MS) });
    const nextDue = (e: { line: LogLine }) => Math.ceil(Date.parse(e.line.time) / 5000) * 5000;
    let expired = await lineAfter(server, 0, /^Expiry sweep complete/);
    // The signal comes about 2 s from now: a run that ended late in its 5 s leaves its next one due before it.
    while (nextDue(expired) - Date.now() < 3500) expired = await lineAfter(server, expired.at + 1, /^Expiry sweep complete/);
    // Its lease released too, the run over.
    await sleep(500);
    proxy.stall();
    await holdSweepStuck();
    const exited = exitOf(server);
    server.child.kill('SIGTERM');
    const signalledAt = Date.now();
    // The expiry sweep's next run was due after the signal, well before SHUTDOWN_TIMEOUT_MS was out.
    const expiryDue = nextDue(expired);
    expect(expiryDue).toBeGreaterThan(signalledAt);
    expect(expiryDue).toBeLessThan(signalledAt + SHUTDOWN_TIMEOUT_MS - 1000);
    const { code, at } = await exited;
    expect(code).toBe(1);
    expect(at - signalledAt).toBeGreaterThanOrEqual(SHUTDOWN_TIMEOUT_MS - 100);
    expect(at - signalledAt).toBeLessThan(SHUTDOWN_TIMEOUT_MS + SLACK_MS);
    const lines = linesOf(server);
    const signalled = lines.findIndex((l) => l.msg.startsWith('SIGTERM received'));
    expect(signalled).toBeGreaterThan(0);
    expect(lines.slice(signalled).filter((l) => / starting its run /.test(l.msg))).toEqual([]);
    expect(lines.at(-1)).toMatchObject({
      level: 50,
      msg: expect.stringMatching(
        /^Not stopped within SHUTDOWN_TIMEOUT_MS \(6000 ms\): exiting, still waiting for .*HoldSweepCronJob\.onModuleDestroy.*the runs in progress of hold-sweep/,
      ),
    });
  }, 120_000);

  it('a second signal exits at once', async () => {
    server = await start({ HOLD_SWEEP_SECONDS: '1' });
    proxy.stall();
    await holdSweepStuck();
    const exited = exitOf(server);
    server.child.kill('SIGTERM');
    await lineAfter(server, 0, /^SIGTERM received/);
    await sleep(500);
    server.child.kill('SIGINT');
    const signalledAt = Date.now();
    const { code, at } = await exited;
    expect(code).toBe(1);
    expect(at - signalledAt).toBeLessThan(SLACK_MS);
    expect(linesOf(server).at(-1)?.msg).toMatch(
      /^SIGINT received again: exiting now, without waiting for .*HoldSweepCronJob\.onModuleDestroy/,
    );
  }, 120_000);

  it('with the database refusing connections instead, the stop stays prompt and graceful', async () => {
    // A sweep whose COMMIT answer the refusal cut off keeps asking whether it committed for
    // OUTCOME_RESOLVE_MS (5 s by default), and the stop waits for that run: shortened here, and allowed for.
    const resolveMs = 1000;
    server = await start({ HOLD_SWEEP_SECONDS: '1', EXPIRE_CRON: '* * * * * *', OUTCOME_RESOLVE_MS: String(resolveMs) });
    await lineAfter(server, 0, /^Job hold-sweep starting its run/);
    await proxy.close();
    await lineAfter(server, linesOf(server).length, /^Hold sweep failed/);
    const exited = exitOf(server);
    server.child.kill('SIGTERM');
    const signalledAt = Date.now();
    const { code, at } = await exited;
    expect(code).toBe(0);
    expect(at - signalledAt).toBeLessThan(resolveMs + SLACK_MS);
    expect(linesOf(server).at(-1)?.msg).toBe('Stopped gracefully');
  }, 120_000);
});
