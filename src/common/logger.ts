import { LoggerService } from '@nestjs/common';
import pino, { Logger } from 'pino';

export function createPino(level: string): Logger {
  return pino({ level, base: { service: 'coupon-engine' }, timestamp: pino.stdTimeFunctions.isoTime });
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
