import { setTimeout } from 'node:timers/promises';
import { Injectable, Logger, OnApplicationBootstrap, OnModuleDestroy } from '@nestjs/common';
import { DataSource, EntityManager } from 'typeorm';
import { isDatabaseOutage } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { counter, gauge, histogram } from '../common/metrics.js';
import { AppConfig } from '../config/app-config.js';
import { Coupon } from '../coupon/coupon.entity.js';
import { LeaseService } from '../database/lease.js';
import { TransactionService } from '../database/transaction.service.js';
import { IssueService, validityEnded } from '../ledger/issue.service.js';
import { StockService } from '../ledger/stock.service.js';
import { TxIds } from '../ledger/tx-id.js';
import { countTowardsLimit } from '../ledger/user-coupons.js';
import {
  discardedJobs,
  discardStaleUploads,
  findJob,
  insertSkips,
  Job,
  nextLines,
  nextRunnableJob,
  purgeDiscarded,
  recordBatch,
  setJobStatus,
  SKIP_REASONS,
  SkipReason,
  STALE_UPLOAD_MS,
} from './issuance.store.js';

const issuedTotal = counter('bulk_issued_total', 'User coupons issued by bulk issuance jobs', []);
const skippedTotal = counter('bulk_skipped_total', 'Lines of bulk issuance jobs not issued, by reason', ['reason']);
const batchSeconds = histogram(
  'bulk_batch_duration_seconds',
  'One bulk issuance batch (one transaction)',
  [],
  [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
);
const progress = gauge('bulk_job_progress_ratio', 'Share of the running bulk job decided so far (0 when none runs)');

export const RUNNER_LEASE = 'issuance-runner';
const IDLE_POLL_MS = 1000;
const PURGE_CHUNK = 5000;
/** Database errors in a row, without a batch committing in between, after which a job fails rather than pauses again. */
export const MAX_PAUSES = 10;

/** The idempotency key a job's coupons carry: with the (user, key) unique index, one coupon per user per job. */
export const bulkKey = (jobId: string) => `bulk:${jobId}`;

/**
 * Runs bulk issuance jobs, one instance at a time across the cluster (the `issuance-runner` lease),
 * one job at a time, in batches of BULK_BATCH_SIZE lines. Each batch is one transaction that
 * decides its lines under the coupon's stock-row lock (the lock every grab of that coupon takes,
 * so perUserLimit counts grabs and bulk issues together and stock cannot be raced), issues the
 * winners in one multi-row INSERT with their log rows, records the skipped lines, and moves the
 * job's cursor. A crash rolls the batch in flight back whole; whoever holds the lease next resumes
 * from the cursor, so every line is decided exactly once.
 */
@Injectable()
export class IssuanceRunner implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger(IssuanceRunner.name);
  private readonly stopping = new AbortController();
  private running: Promise<void> = Promise.resolve();
  private wakeUp: (() => void) | null = null;
  /** Pauses in a row per job (this instance's; a new lease holder starts again from 0). */
  private readonly pauses = new Map<string, number>();

  constructor(
    private readonly ds: DataSource,
    private readonly tx: TransactionService,
    private readonly leases: LeaseService,
    private readonly issuer: IssueService,
    private readonly stock: StockService,
    private readonly config: AppConfig,
  ) {}

  onApplicationBootstrap(): void {
    if (this.config.BULK_RUNNER_ENABLED) this.running = this.lead();
  }

  async onModuleDestroy(): Promise<void> {
    this.stopping.abort();
    this.wakeUp?.();
    await this.running;
  }

  /** A job was queued on this instance: look now instead of at the next poll. */
  wake(): void {
    this.wakeUp?.();
  }

  private async lead(): Promise<void> {
    while (!this.stopping.signal.aborted) {
      try {
        await this.leases.runExclusive(RUNNER_LEASE, (signal) => this.runQueued(AbortSignal.any([signal, this.stopping.signal])));
      } catch (err) {
        this.logger.warn(`Bulk issuance runner: ${(err as Error).message}`);
      }
      await new Promise<void>((resolve) => {
        this.wakeUp = resolve;
        // timers/promises lets go of its abort listener when the timer fires: one added per poll and kept would leak.
        void setTimeout(IDLE_POLL_MS, undefined, { signal: this.stopping.signal }).then(resolve, resolve);
      });
      this.wakeUp = null;
    }
  }

  /** Every runnable job, oldest first, until none is left or `signal` (lease lost, shutdown). */
  async runQueued(signal?: AbortSignal): Promise<void> {
    await this.purge(signal);
    for (;;) {
      if (signal?.aborted) return;
      const job = await nextRunnableJob(this.ds.manager);
      if (!job) return;
      if ((await this.runJob(job, signal)) === 'paused') return;
    }
  }

  /** Removes discarded uploads in small statements, so no statement runs long on a million lines. */
  private async purge(signal?: AbortSignal): Promise<void> {
    await this.tx.inTransaction((em) => discardStaleUploads(em, new Date(Date.now() - STALE_UPLOAD_MS), new Date()));
    for (const jobId of await discardedJobs(this.ds.manager)) {
      while (!signal?.aborted && (await this.tx.inTransaction((em) => purgeDiscarded(em, jobId, PURGE_CHUNK))) > 0);
    }
  }

  /**
   * Runs one job until it ends, `signal`, or a database error. An outage, a lost connection or a
   * lock wait that outlasted the retries leaves the job RUNNING ('paused'): its batch rolled back
   * (or, its COMMIT answer lost, settles when the batch reruns, as the cursor moves in the same
   * transaction), and the next pass resumes it from the cursor, as after a crash; the MAX_PAUSES-th
   * such error in a row, and any other error, fails the job.
   */
  async runJob(queued: Job, signal?: AbortSignal): Promise<'ran' | 'paused'> {
    if (
      queued.status === 'QUEUED' &&
      !(await this.tx.inTransaction((em) => setJobStatus(em, queued.id, ['QUEUED'], 'RUNNING', new Date())))
    )
      return 'ran';
    this.logger.log(`Bulk issuance job ${queued.id} (coupon ${queued.couponId}, ${queued.total} lines) runs from line ${queued.nextLine}`);
    const coupon = await this.ds.manager.findOneBy(Coupon, { id: queued.couponId });
    try {
      while (!signal?.aborted) {
        const started = performance.now();
        const more = await this.tx.inTransaction((em) => this.batch(em, queued.id, coupon as Coupon));
        this.pauses.delete(queued.id);
        batchSeconds.observe((performance.now() - started) / 1000);
        if (!more) break;
      }
    } catch (err) {
      const paused = (this.pauses.get(queued.id) ?? 0) + 1;
      // A batch that fails the same way every time (a statement past DB_STATEMENT_TIMEOUT_MS, say) must not hold the queue for ever.
      if ((isDatabaseOutage(err) || (err instanceof AppError && err.code === 'OUTCOME_UNKNOWN')) && paused < MAX_PAUSES) {
        this.pauses.set(queued.id, paused);
        this.logger.warn(
          `Bulk issuance job ${queued.id} paused by a database error (${paused} in a row), resumes at the next pass: ${(err as Error).message}`,
        );
        return 'paused';
      }
      this.pauses.delete(queued.id);
      this.logger.error(`Bulk issuance job ${queued.id} failed: ${(err as Error).message}`);
      await this.tx.inTransaction((em) => setJobStatus(em, queued.id, ['RUNNING'], 'FAILED', new Date()));
    } finally {
      progress.set(0);
    }
    const job = await findJob(this.ds.manager, queued.id);
    if (job && job.status !== 'RUNNING') {
      this.logger.log(`Bulk issuance job ${job.id} ${job.status}: ${job.issued} issued, ${JSON.stringify(job.skippedByReason)} skipped`);
    }
    return 'ran';
  }

  /** One batch in the caller's transaction; false when the job has nothing more to do. */
  private async batch(em: EntityManager, jobId: string, coupon: Coupon): Promise<boolean> {
    const job = await findJob(em, jobId, true);
    if (!job || job.status !== 'RUNNING') return false;
    const now = new Date();
    const lines = await nextLines(em, jobId, job.nextLine, this.config.BULK_BATCH_SIZE);
    if (lines.length === 0) {
      await setJobStatus(em, jobId, ['RUNNING'], 'COMPLETED', now);
      return false;
    }
    const key = bulkKey(jobId);
    const stockRow = await this.stock.lock(em, coupon.id);
    let remaining = job.fromStock ? (stockRow?.stock ?? 0) : Infinity;
    const fresh = lines.filter((l) => !l.duplicate);
    const users = fresh.map((l) => l.userId);
    const held = users.length > 0 ? await countTowardsLimit(em, coupon.id, users) : new Map<string, number>();

    // Checked once the stock row is locked, as a grab is: no line is issued a coupon born EXPIRED.
    const ended = validityEnded(coupon, new Date()) !== null;
    const granted: { userId: string; key: string }[] = [];
    const skips: { lineNo: number; userId: string; reason: SkipReason }[] = [];
    for (const l of lines) {
      const reason: SkipReason | null = l.duplicate
        ? 'DUPLICATE'
        : ended
          ? 'COUPON_EXPIRED'
          : (held.get(l.userId) ?? 0) >= coupon.perUserLimit
            ? 'USER_LIMIT_REACHED'
            : remaining <= 0
              ? 'SOLD_OUT'
              : null;
      if (reason) {
        skips.push({ lineNo: l.lineNo, userId: l.userId, reason });
      } else {
        granted.push({ userId: l.userId, key });
        remaining--;
      }
    }
    await this.issuer.issueMany(
      em,
      coupon,
      granted,
      { source: 'BULK', fromStock: job.fromStock, reason: job.reason, txId: () => TxIds.bulk(jobId) },
      now,
    );
    await insertSkips(em, jobId, skips);
    const skippedByReason = Object.fromEntries(SKIP_REASONS.map((r) => [r, skips.filter((s) => s.reason === r).length])) as Record<
      SkipReason,
      number
    >;
    await recordBatch(em, jobId, lines[lines.length - 1].lineNo + 1, granted.length, skippedByReason, now);
    // Counted before the commit: a rolled-back batch is counted again when it reruns (as the transitions counter does).
    issuedTotal.inc(granted.length);
    for (const r of SKIP_REASONS) if (skippedByReason[r] > 0) skippedTotal.inc({ reason: r }, skippedByReason[r]);
    if (job.total > 0)
      progress.set(
        (job.issued + granted.length + Object.values(job.skippedByReason).reduce((a, b) => a + b, 0) + skips.length) / job.total,
      );
    return true;
  }
}
