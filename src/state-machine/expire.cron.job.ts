import { Injectable } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { ScheduledCronJob } from '../common/cron-job.js';
import { AppConfig } from '../config/app-config.js';
import { ExpiryService } from './expiry.service.js';

export const EXPIRE_JOB = 'expire-user-coupons';

/**
 * The expiry sweep on EXPIRE_CRON (UTC). On shutdown the run in progress finishes its current batch
 * and stops; the next run, here or on another instance, picks up the rest.
 */
@Injectable()
export class ExpireCronJob extends ScheduledCronJob {
  constructor(
    scheduler: SchedulerRegistry,
    config: AppConfig,
    private readonly expiry: ExpiryService,
  ) {
    super(scheduler, { name: EXPIRE_JOB, cronTime: config.EXPIRE_CRON, timeZone: 'UTC', enabled: config.SCHEDULER_ENABLED });
  }

  protected run(signal: AbortSignal, due: Date): Promise<void> {
    return this.expiry.runScheduled(signal, due);
  }
}
