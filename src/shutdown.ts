import type { Server } from 'node:http';
import { Logger } from '@nestjs/common';
import type { INestApplication } from '@nestjs/common';

const logger = new Logger('Shutdown');

/**
 * SIGTERM or SIGINT closes the app the way Nest orders it: the cron jobs stop (a sweep finishes its
 * batch), the HTTP server stops accepting and waits for the requests in flight, then the database
 * pool closes; then the process exits 0. Handled here rather than by enableShutdownHooks(), which
 * re-raises the signal after closing, so npm reports the stop as a crash and nothing logs the end.
 */
export function closeOnSignals(app: INestApplication): void {
  let closing = false;
  const stop = (signal: NodeJS.Signals) => {
    if (closing) return;
    closing = true;
    logger.log(`${signal} received: finishing requests in flight, stopping jobs, closing the database pool`);
    // The server closes the keep-alive connections idle when it starts closing, not those that
    // become idle once their request in flight is answered; without this they would hold the
    // close up for the keep-alive timeout (72 s).
    const server = app.getHttpServer() as Server;
    setInterval(() => server.closeIdleConnections(), 100).unref();
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
