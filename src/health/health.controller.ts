import { timingSafeEqual } from 'node:crypto';
import { Controller, Get, Header, Req } from '@nestjs/common';
import { ApiTags } from '@nestjs/swagger';
import { HealthCheck, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import type { FastifyRequest } from 'fastify';
import { bearerToken } from '../auth/auth.guard.js';
import { Public } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import { AppConfig } from '../config/app-config.js';
import { registry } from '../common/metrics.js';

@ApiTags('operations')
@Controller()
@Public()
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly db: TypeOrmHealthIndicator,
    private readonly config: AppConfig,
  ) {}

  /** 200 when the database answers, 503 otherwise (terminus throws ServiceUnavailableException). */
  @Get('health')
  @HealthCheck()
  check() {
    return this.health.check([() => this.db.pingCheck('database', { timeout: 1500 })]);
  }

  @Get('metrics')
  @Header('Content-Type', registry.contentType)
  metrics(@Req() request: FastifyRequest): Promise<string> {
    const expected = this.config.METRICS_TOKEN;
    if (expected !== undefined) {
      const token = Buffer.from(bearerToken(request) ?? '');
      const wanted = Buffer.from(expected);
      if (token.length !== wanted.length || !timingSafeEqual(token, wanted)) {
        throw new AppError('UNAUTHENTICATED', '/metrics needs Authorization: Bearer <METRICS_TOKEN>');
      }
    }
    return registry.metrics();
  }
}
