import { Injectable, Logger, OnModuleDestroy, OnModuleInit } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { CronJob } from 'cron';
import { AppConfig } from '../config/app-config.js';
import { ExpiryService } from './expiry.service.js';

export const EXPIRE_JOB = 'expire-user-coupons';

/**
 * Runs the expiry sweep on EXPIRE_CRON (UTC). Registered by hand rather than with @Cron so the
 * expression comes from the validated config. On shutdown the run in progress finishes its current
 * batch and stops; the next run, here or on another instance, picks up the rest.
 */
@Injectable()
export class ExpireCron implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger(ExpireCron.name);
  private readonly stopping = new AbortController();
  private running: Promise<void> = Promise.resolve();

  constructor(
    private readonly expiry: ExpiryService,
    private readonly scheduler: SchedulerRegistry,
    private readonly config: AppConfig,
  ) {}

  onModuleInit(): void {
    if (!this.config.SCHEDULER_ENABLED) return;
    const job = CronJob.from({ cronTime: this.config.EXPIRE_CRON, timeZone: 'UTC', waitForCompletion: true, onTick: () => this.tick() });
    this.scheduler.addCronJob(EXPIRE_JOB, job);
    job.start();
  }

  tick(): Promise<void> {
    return (this.running = this.expiry.runExclusive({ signal: this.stopping.signal }).then(
      () => undefined,
      (err: unknown) => this.logger.error(`Expiry sweep failed: ${String(err)}`),
    ));
  }

  async onModuleDestroy(): Promise<void> {
    if (this.scheduler.doesExist('cron', EXPIRE_JOB)) await this.scheduler.getCronJob(EXPIRE_JOB).stop();
    this.stopping.abort();
    await this.running;
  }
}
