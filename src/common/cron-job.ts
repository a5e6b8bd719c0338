import { Logger, OnApplicationBootstrap, OnModuleDestroy } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { CronJob, CronTime } from 'cron';

const logger = new Logger('Scheduler');

export interface CronJobSpec {
  /** Its name in the SchedulerRegistry. */
  name: string;
  cronTime: string;
  timeZone: string;
  /** SCHEDULER_ENABLED: instances that do not run jobs register none. */
  enabled: boolean;
}

/**
 * A six-field cron expression that fires at least every `seconds` (1..3600): a step of seconds
 * under a minute, of whole minutes above. A step that does not divide 60 makes the last gap of each
 * minute (or hour) shorter, never longer.
 */
export function everySeconds(seconds: number): string {
  if (!Number.isInteger(seconds) || seconds < 1 || seconds > 3600) throw new RangeError(`everySeconds: ${seconds} is not 1..3600`);
  if (seconds < 60) return `*/${seconds} * * * * *`;
  const minutes = Math.floor(seconds / 60);
  return minutes < 60 ? `0 */${minutes} * * * *` : '0 0 * * * *';
}

/**
 * The latest time `cronTime` fires at or before `now`, starting from `due`, a fire time at or before
 * it: the time a tick is for. A timer fires late on a busy event loop, and waitForCompletion drops
 * the ticks that come while a run is going, so the tick's own clock does not say which it is.
 */
export function dueAt(cronTime: CronTime, timeZone: string, due: Date, now: Date): Date {
  for (
    let next = cronTime.getNextDateFrom(due, timeZone).toJSDate();
    next <= now;
    next = cronTime.getNextDateFrom(next, timeZone).toJSDate()
  )
    due = next;
  return due;
}

/**
 * How long after its due time a sweep's tick keeps its lease once its run is done (Lease.release):
 * the instances' timers for one tick fire up to a moment apart, and the lease, free again at once,
 * let one whose timer fired after another's run ended run the tick again (an SRE probe saw two runs
 * of one tick). Half the shortest period a sweep may have (1 s), so the next tick always finds it
 * free; a timer later than this runs the tick again, and every sweep is safe to run twice.
 */
const TICK_MS = 500;

export const tickEnd = (due: Date): Date => new Date(due.getTime() + TICK_MS);

/**
 * A cron job whose schedule comes from the validated config, hence registered by hand rather than
 * with @Cron. Every job is registered and stopped the same way: registered at bootstrap; at
 * shutdown it stops firing, tells the run in progress to stop (the signal) and waits for it. A
 * tick that is still running holds the next one back.
 */
export abstract class ScheduledCronJob implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly stopping = new AbortController();
  private running: Promise<void> = Promise.resolve();

  protected constructor(
    private readonly scheduler: SchedulerRegistry,
    private readonly spec: CronJobSpec,
  ) {}

  /** The fire time of the next tick, or of one since: read when the job starts, moved on by each tick. */
  private due = new Date();

  /**
   * One run, for the tick due at `due` (on every instance the same time, which a job can use to run
   * once per tick across the cluster). Must never reject, and must resolve soon after `signal` aborts.
   */
  protected abstract run(signal: AbortSignal, due: Date): Promise<void>;

  onApplicationBootstrap(): void {
    if (!this.spec.enabled) return;
    const job = CronJob.from({
      cronTime: this.spec.cronTime,
      timeZone: this.spec.timeZone,
      waitForCompletion: true,
      onTick: () => {
        this.due = dueAt(job.cronTime, this.spec.timeZone, this.due, new Date());
        // Most runs log nothing when they find nothing to do; this says when each one began.
        logger.debug(`Job ${this.spec.name} starting its run due ${this.due.toISOString()}`);
        return this.tick(this.due);
      },
      start: false,
    });
    this.scheduler.addCronJob(this.spec.name, job);
    job.start();
    this.due = job.nextDate().toJSDate();
  }

  tick(due: Date): Promise<void> {
    return (this.running = this.run(this.stopping.signal, due));
  }

  async onModuleDestroy(): Promise<void> {
    if (this.scheduler.doesExist('cron', this.spec.name)) await this.scheduler.getCronJob(this.spec.name).stop();
    this.stopping.abort();
    await this.running;
  }
}
