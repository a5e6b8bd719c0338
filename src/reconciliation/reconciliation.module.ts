import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { LedgerModule } from '../ledger/ledger.module.js';
import { AuditService } from './audit.service.js';
import { Compensation } from './compensation.entity.js';
import { CompensationController } from './compensation.controller.js';
import { CompensationService } from './compensation.service.js';
import { Discrepancy } from './discrepancy.entity.js';
import { ReconcileCronJob } from './reconcile.cron.job.js';
import { ReconciliationRun } from './reconciliation-run.entity.js';
import { ReconciliationController } from './reconciliation.controller.js';
import { ReconciliationService } from './reconciliation.service.js';

@Module({
  imports: [TypeOrmModule.forFeature([ReconciliationRun, Discrepancy, Compensation]), LedgerModule],
  controllers: [ReconciliationController, CompensationController],
  providers: [AuditService, ReconciliationService, CompensationService, ReconcileCronJob],
  exports: [ReconciliationService, CompensationService],
})
export class ReconciliationModule {}
