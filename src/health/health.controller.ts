import { timingSafeEqual } from 'node:crypto';
import { Controller, Get, Header, Req, ServiceUnavailableException } from '@nestjs/common';
import { ApiTags } from '@nestjs/swagger';
import { HealthCheck, HealthCheckResult, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import type { FastifyRequest } from 'fastify';
import { bearerToken } from '../auth/auth.guard.js';
import { Public } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import { AppConfig } from '../config/app-config.js';
import { registry } from '../common/metrics.js';
import { HealthDatabase } from './health-database.js';
import { runWithDeadline } from '../database/deadline-pool.js';
import { Stopping } from '../common/stopping.js';

const PING_MS = 1500;

@ApiTags('operations')
@Controller()
@Public()
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly db: TypeOrmHealthIndicator,
    private readonly database: HealthDatabase,
    private readonly config: AppConfig,
    private readonly stopping: Stopping,
  ) {}

  /**
   * 200 when the database answers (on a connection of its own: a busy pool is not an outage); 503
   * naming the checks that failed, with terminus's report of each in `details.checks`; 503 too
   * while the instance drains before it stops (SHUTDOWN_DRAIN_MS), its check `stopping`.
   */
  @Get('health')
  @HealthCheck()
  async check(): Promise<HealthCheckResult> {
    if (this.stopping.draining) {
      throw new AppError(
        'SERVICE_UNAVAILABLE',
        'Health check failed: stopping (draining before it stops; send requests to another instance)',
        { checks: { stopping: { status: 'down' } } },
        { 'Retry-After': '1' },
      );
    }
    try {
      // Its own deadline, not the request's: a ping still unanswered then gives its connection up
      // (deadline-pool.ts), where terminus's timeout only stops waiting and the next probes would
      // queue behind it for the health check's only connection.
      return await runWithDeadline({ at: Date.now() + PING_MS, answered: false }, () =>
        this.health.check([() => this.db.pingCheck('database', { connection: this.database.dataSource, timeout: PING_MS })]),
      );
    } catch (err) {
      if (!(err instanceof ServiceUnavailableException)) throw err;
      const report = err.getResponse() as HealthCheckResult;
      const failed = Object.keys(report.error ?? {});
      throw new AppError(
        'SERVICE_UNAVAILABLE',
        `Health check failed: ${failed.join(', ')}`,
        { checks: report.details },
        { 'Retry-After': '1' },
      );
    }
  }

  @Get('metrics')
  @Header('Content-Type', registry.contentType)
  metrics(@Req() request: FastifyRequest): Promise<string> {
    const expected = this.config.METRICS_TOKEN;
    if (expected !== undefined) {
      const token = Buffer.from(bearerToken(request.raw) ?? '');
      const wanted = Buffer.from(expected);
      if (token.length !== wanted.length || !timingSafeEqual(token, wanted)) {
        throw new AppError('UNAUTHENTICATED', '/metrics needs Authorization: Bearer <METRICS_TOKEN>');
      }
    }
    return registry.metrics();
  }
}
