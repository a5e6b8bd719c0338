import { Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { LedgerModule } from '../ledger/ledger.module.js';
import { DatabaseMetrics } from './database-metrics.js';
import { HealthDatabase } from './health-database.js';
import { HealthController } from './health.controller.js';

@Module({ imports: [TerminusModule, LedgerModule], controllers: [HealthController], providers: [DatabaseMetrics, HealthDatabase] })
export class HealthModule {}
