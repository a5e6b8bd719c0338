import { LoggerService } from '@nestjs/common';
import pino, { Logger } from 'pino';
import pretty from 'pino-pretty';
import type { AppConfig } from '../config/app-config.js';

/** JSON lines for machines; in development (or LOG_FORMAT=pretty) coloured lines for people, written synchronously. */
export function createPino(config: Pick<AppConfig, 'LOG_LEVEL' | 'LOG_FORMAT' | 'NODE_ENV'>): Logger {
  const options = { level: config.LOG_LEVEL, base: { service: 'coupon-engine' }, timestamp: pino.stdTimeFunctions.isoTime };
  const format = config.LOG_FORMAT ?? (config.NODE_ENV === 'development' ? 'pretty' : 'json');
  return format === 'pretty'
    ? pino(
        options,
        pretty({
          sync: true,
          singleLine: true,
          translateTime: 'SYS:HH:MM:ss.l',
          ignore: 'pid,hostname,service,context',
          messageFormat: '{if context}[{context}] {end}{msg}',
        }),
      )
    : pino(options);
}

/** Nest's own log lines (boot, cron, errors) go to the same JSON stream as Fastify's request logs. */
export class PinoNestLogger implements LoggerService {
  constructor(private readonly pino: Logger) {}
  log(message: unknown, context?: string) {
    this.pino.info({ context }, String(message));
  }
  error(message: unknown, trace?: string, context?: string) {
    this.pino.error({ context, trace }, String(message));
  }
  warn(message: unknown, context?: string) {
    this.pino.warn({ context }, String(message));
  }
  debug(message: unknown, context?: string) {
    this.pino.debug({ context }, String(message));
  }
  verbose(message: unknown, context?: string) {
    this.pino.trace({ context }, String(message));
  }
}
