import { Logger } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { createApp } from './app.factory.js';
import { ConfigError, databaseHosts, loadConfig, readEnvFile } from './config/app-config.js';
import { DatabaseUnreachableError, lostWhileStarting, prepareDatabase } from './database/bootstrap-database.js';
import { closeOnSignals } from './shutdown.js';

const LISTEN_BACKLOG = 8192;

/** Why the address cannot be listened on, for the errors an operator fixes with PORT or HOST. */
const LISTEN_ERRORS: Record<string, string> = {
  EADDRINUSE: 'another process is listening there (choose another PORT, or stop it)',
  EADDRNOTAVAIL: 'HOST is not an address of this machine',
  EACCES: 'not allowed to listen on this port (ports below 1024 need privileges)',
  ENOTFOUND: 'HOST does not resolve',
};

async function main(): Promise<void> {
  readEnvFile();
  const config = loadConfig();
  const applied = await prepareDatabase(config, (line) => console.error(`coupon-engine: ${line}`)).catch(lostWhileStarting(config));
  const app = await createApp(config).catch(lostWhileStarting(config));
  // Here rather than in listen(), so that the lifecycle hooks' statements (the pool's warm-up among them) are covered too.
  await app.init().catch(lostWhileStarting(config));
  closeOnSignals(app, config);
  const logger = new Logger('Bootstrap');
  logger.log(
    `Database ${config.DB_NAME} on ${databaseHosts(config)
      .map((h) => `${h.host}:${h.port}`)
      .join(', ')} as ${config.DB_USER}, pool of ${config.DB_POOL_SIZE}; ` +
      (applied.length > 0 ? `migrations applied now: ${applied.join(', ')}` : 'no migration pending'),
  );
  // Node's default accept queue (511) overflowed when 10,000 shoppers connected at once: the kernel
  // dropped their handshakes' last ACK, and 615 of them were reset 15 s later (SYN-ACK retries spent).
  // The kernel caps this at net.core.somaxconn.
  await app.listen({ port: config.PORT, host: config.HOST, backlog: LISTEN_BACKLOG }).catch((err: NodeJS.ErrnoException) => {
    const why = LISTEN_ERRORS[err.code ?? ''];
    throw why ? new ConfigError(`Cannot listen on ${config.HOST}:${config.PORT}: ${why}`) : err;
  });
  const jobs = [...app.get(SchedulerRegistry).getCronJobs()];
  if (jobs.length === 0) logger.log('No jobs scheduled on this instance (SCHEDULER_ENABLED=false)');
  for (const [name, job] of jobs) {
    logger.log(
      `Job ${name} scheduled: "${String(job.cronTime.source)}" in ${job.cronTime.timeZone ?? 'UTC'}, next run ${job.nextDate().toISO()}`,
    );
  }
  logger.log(`Listening on ${config.HOST}:${config.PORT} (${config.NODE_ENV})`);
}

main().catch((err: unknown) => {
  // Configuration and connectivity problems are the operator's to fix: one clear line, no stack.
  if (err instanceof ConfigError || err instanceof DatabaseUnreachableError) console.error(`coupon-engine: ${err.message}`);
  else console.error(err);
  process.exit(1);
});
