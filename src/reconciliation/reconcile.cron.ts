import { Injectable, OnApplicationBootstrap } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { CronJob } from 'cron';
import { AppConfig } from '../config/app-config.js';
import { ReconciliationService } from './reconciliation.service.js';

/** The nightly run, on RECONCILE_CRON in RECONCILE_TIMEZONE (registered at boot because the expression comes from config). */
@Injectable()
export class ReconcileCron implements OnApplicationBootstrap {
  constructor(
    private readonly config: AppConfig,
    private readonly scheduler: SchedulerRegistry,
    private readonly reconciliation: ReconciliationService,
  ) {}

  onApplicationBootstrap(): void {
    if (!this.config.SCHEDULER_ENABLED) return;
    const job = CronJob.from({
      cronTime: this.config.RECONCILE_CRON,
      timeZone: this.config.RECONCILE_TIMEZONE,
      onTick: () => this.tick(),
      start: false,
    });
    this.scheduler.addCronJob('reconcile', job);
    job.start();
  }

  tick(): Promise<void> {
    return this.reconciliation.runScheduled();
  }
}
