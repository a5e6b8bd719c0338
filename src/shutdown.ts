import { Logger } from '@nestjs/common';
import type { INestApplication } from '@nestjs/common';
import { ModulesContainer } from '@nestjs/core';
import { SchedulerRegistry } from '@nestjs/schedule';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AppConfig } from './config/app-config.js';
import { Stopping } from './common/stopping.js';

const logger = new Logger('Shutdown');

/** The lifecycle hooks app.close() awaits, in its order. */
const SHUTDOWN_HOOKS = ['onModuleDestroy', 'beforeApplicationShutdown', 'onApplicationShutdown'] as const;

/**
 * Notes each shutdown hook of the app's modules and providers, and the HTTP server's close, while
 * it runs: the names a shutdown that overruns was still waiting for. Nest awaits the hooks one
 * module after another, so the set holds what is stuck now, not what comes after it.
 */
function trackShutdown(app: INestApplication): Set<string> {
  const pending = new Set<string>();
  const track = (owner: object, method: string, name: string) => {
    const target = owner as Record<string, unknown>;
    const original = target[method];
    if (typeof original !== 'function') return;
    target[method] = async (...args: unknown[]) => {
      pending.add(name);
      try {
        return await (original as (...a: unknown[]) => unknown).apply(owner, args);
      } finally {
        pending.delete(name);
      }
    };
  };
  for (const module of app.get(ModulesContainer).values()) {
    for (const wrapper of [...module.providers.values(), ...module.controllers.values(), ...module.injectables.values()]) {
      const instance: unknown = wrapper.instance;
      // As Nest's own hook runner: request-scoped and transient providers have no single instance to stop.
      if (instance === null || typeof instance !== 'object' || !wrapper.isDependencyTreeStatic() || wrapper.isTransient) continue;
      for (const hook of SHUTDOWN_HOOKS) track(instance, hook, `${wrapper.name}.${hook}`);
    }
  }
  track(app.getHttpAdapter(), 'close', 'the HTTP server (requests in flight)');
  return pending;
}

/** What the shutdown is still waiting for, for its last log line. */
function describePending(app: INestApplication, pending: Set<string>): string {
  const runs = [...app.get(SchedulerRegistry).getCronJobs()].filter(([, job]) => job.isCallbackRunning).map(([name]) => name);
  const parts = [...pending];
  if (runs.length > 0) parts.push(`the runs in progress of ${runs.join(', ')}`);
  return parts.length > 0 ? parts.join(', ') : 'nothing it can name';
}

/**
 * SIGTERM or SIGINT closes the app the way Nest orders it: the cron jobs stop (a sweep finishes its
 * batch), the instance drains (SHUTDOWN_DRAIN_MS: serving, but /health 503 and every connection
 * closed after its answer; see Stopping), the HTTP server stops accepting and waits for the
 * requests in flight, then the database pool closes; then the process exits 0. Handled here rather
 * than by enableShutdownHooks(), which re-raises the signal after closing, so npm reports the stop
 * as a crash and nothing logs the end.
 *
 * Every cron job stops firing at the signal itself: Nest stops each one only when its module's
 * turn comes, and while the modules before it waited (on a stalled database, up to
 * DB_STATEMENT_TIMEOUT_MS a statement) the others kept starting runs. The whole stop is bounded by
 * SHUTDOWN_TIMEOUT_MS: then the process says what it was still waiting for and exits 1, rather than
 * wait for an orchestrator's SIGKILL, which ends it without a word. A second signal (an operator's
 * second Ctrl-C) exits 1 at once.
 */
export function closeOnSignals(app: INestApplication, config: Pick<AppConfig, 'SHUTDOWN_TIMEOUT_MS' | 'SHUTDOWN_DRAIN_MS'>): void {
  const { SHUTDOWN_TIMEOUT_MS: timeoutMs, SHUTDOWN_DRAIN_MS: drainMs } = config;
  let stopping: Set<string> | undefined;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.error(`${signal} received again: exiting now, without waiting for ${describePending(app, stopping)}`);
      process.exit(1);
    }
    const pending = trackShutdown(app);
    stopping = pending;
    for (const job of app.get(SchedulerRegistry).getCronJobs().values()) void job.stop();
    app.get(Stopping).begin();
    logger.log(
      `${signal} received: ${drainMs > 0 ? `draining for ${drainMs} ms (/health answers 503), then ` : ''}finishing requests in flight, stopping jobs, closing the database pool (at most ${timeoutMs} ms; a second signal exits at once)`,
    );
    // Not unref'd: a close that never settles would otherwise let the process end unannounced, with code 0.
    setTimeout(() => {
      logger.error(`Not stopped within SHUTDOWN_TIMEOUT_MS (${timeoutMs} ms): exiting, still waiting for ${describePending(app, pending)}`);
      process.exit(1);
    }, timeoutMs);
    sleep(drainMs)
      .then(() => app.close())
      .then(
        () => {
          logger.log('Stopped gracefully');
          process.exit(0);
        },
        (err: unknown) => {
          logger.error(`Shutdown failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
          process.exit(1);
        },
      );
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
