import { Injectable } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { everySeconds, ScheduledCronJob } from '../common/cron-job.js';
import { AppConfig } from '../config/app-config.js';
import { HoldSweepService } from './hold-sweep.service.js';

export const HOLD_SWEEP_JOB = 'hold-sweep';

/**
 * The hold sweep at least every HOLD_SWEEP_SECONDS. On shutdown the run in progress finishes its
 * current batch and stops; the next run, here or on another instance, releases the rest.
 */
@Injectable()
export class HoldSweepCronJob extends ScheduledCronJob {
  constructor(
    scheduler: SchedulerRegistry,
    config: AppConfig,
    private readonly sweeps: HoldSweepService,
  ) {
    super(scheduler, {
      name: HOLD_SWEEP_JOB,
      cronTime: everySeconds(config.HOLD_SWEEP_SECONDS),
      timeZone: 'UTC',
      enabled: config.SCHEDULER_ENABLED,
    });
  }

  protected run(signal: AbortSignal, due: Date): Promise<void> {
    return this.sweeps.runScheduled(signal, due);
  }
}
