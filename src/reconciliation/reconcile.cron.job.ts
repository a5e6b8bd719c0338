import { Injectable } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { ScheduledCronJob } from '../common/cron-job.js';
import { AppConfig } from '../config/app-config.js';
import { ReconciliationService } from './reconciliation.service.js';

export const RECONCILE_JOB = 'reconcile';

/** The nightly INCREMENTAL run, on RECONCILE_CRON in RECONCILE_TIMEZONE. */
@Injectable()
export class ReconcileCronJob extends ScheduledCronJob {
  constructor(
    scheduler: SchedulerRegistry,
    config: AppConfig,
    private readonly reconciliation: ReconciliationService,
  ) {
    super(scheduler, {
      name: RECONCILE_JOB,
      cronTime: config.RECONCILE_CRON,
      timeZone: config.RECONCILE_TIMEZONE,
      enabled: config.SCHEDULER_ENABLED,
    });
  }

  protected run(signal: AbortSignal, due: Date): Promise<void> {
    return this.reconciliation.runScheduled(signal, due);
  }
}
