import { Logger } from '@nestjs/common';
import type { INestApplication } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';

const logger = new Logger('Shutdown');

/**
 * SIGTERM or SIGINT closes the app the way Nest orders it: the cron jobs stop (a sweep finishes its
 * batch), the HTTP server stops accepting and waits for the requests in flight, then the database
 * pool closes; then the process exits 0. Handled here rather than by enableShutdownHooks(), which
 * re-raises the signal after closing, so npm reports the stop as a crash and nothing logs the end.
 *
 * Every cron job stops firing at the signal itself: Nest stops each one only when its module's
 * turn comes, and while the modules before it waited (on a stalled database, up to
 * DB_STATEMENT_TIMEOUT_MS a statement) the others kept starting runs.
 */
export function closeOnSignals(app: INestApplication): void {
  let closing = false;
  const stop = (signal: NodeJS.Signals) => {
    if (closing) return;
    closing = true;
    for (const job of app.get(SchedulerRegistry).getCronJobs().values()) void job.stop();
    logger.log(`${signal} received: finishing requests in flight, stopping jobs, closing the database pool`);
    app.close().then(
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
