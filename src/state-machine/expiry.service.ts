import { tickEnd } from '../common/cron-job.js';
import { Injectable, Logger } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { counter, gauge, histogram } from '../common/metrics.js';
import { AppConfig } from '../config/app-config.js';
import { LeaseService } from '../database/lease.js';
import { TransactionService } from '../database/transaction.service.js';
import { StateMachineService } from '../ledger/state-machine.service.js';
import { TxIds } from '../ledger/tx-id.js';
import { lockExpired } from '../ledger/user-coupons.js';

const rowsExpired = counter('expiry_sweep_rows_total', 'User coupons moved UNUSED -> EXPIRED by the expiry sweep', []);
const runs = counter('expiry_sweep_runs_total', 'Expiry sweep runs by outcome (skipped: another instance held the lease)', ['outcome']);
const duration = histogram(
  'expiry_sweep_duration_seconds',
  'Duration of one expiry sweep run',
  ['outcome'],
  [0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300],
);
const lastSuccess = gauge(
  'expiry_sweep_last_complete_timestamp_seconds',
  'When an expiry sweep last reached the end of the expired coupons',
);

export interface SweepOptions {
  /** The cut-off: coupons with expires_at <= now expire. Fixed for the whole run so it ends. */
  now?: Date;
  /** Stop after this many batches (each committed on its own). */
  maxBatches?: number;
  /** Checked between batches: the current batch commits, the next one does not start. */
  signal?: AbortSignal;
  /** No other run starts before then (Lease.release): a cron tick's end, so the tick runs once across the cluster. */
  keptUntil?: Date;
}

export interface SweepResult {
  expired: number;
  batches: number;
  /** True when the last batch found fewer candidates than the batch size: nothing expired is left (except rows locked by a redemption in flight, which that redemption settles). */
  complete: boolean;
  durationMs: number;
}

export const EXPIRY_LEASE = 'expire';

/**
 * Moves UNUSED coupons past their expiry to EXPIRED, in batches of EXPIRE_BATCH_SIZE, each batch
 * one transaction with its log rows. Readers already treat such coupons as expired
 * (effectiveStatus), so the sweep only makes the stored status catch up; stopping it anywhere
 * loses nothing, and the next run carries on from what is left.
 */
@Injectable()
export class ExpiryService {
  private readonly logger = new Logger(ExpiryService.name);

  constructor(
    private readonly tx: TransactionService,
    private readonly stateMachine: StateMachineService,
    private readonly config: AppConfig,
    private readonly leases: LeaseService,
  ) {}

  /**
   * The sweep, if no other instance (or overlapping run of this one) is sweeping: it runs under the
   * `expire` lease, and stops at the next batch if the lease is lost. Returns null when skipped.
   */
  async runExclusive(opts: SweepOptions = {}): Promise<SweepResult | null> {
    const result = await this.leases.runExclusive(
      EXPIRY_LEASE,
      (lost) => this.sweep({ ...opts, signal: opts.signal ? AbortSignal.any([opts.signal, lost]) : lost }),
      // A run stopped short (shutdown, the lease lost) leaves the tick to an instance whose timer fires later.
      (r) => (r.complete ? opts.keptUntil : undefined),
    );
    if (result === null) {
      runs.inc({ outcome: 'skipped' });
      this.logger.log('Expiry sweep skipped: another run holds the lease');
    }
    return result;
  }

  /** The cron's entry point for the tick due at `due`: never throws (the next tick tries again). */
  async runScheduled(signal: AbortSignal, due: Date): Promise<void> {
    try {
      await this.runExclusive({ signal, keptUntil: tickEnd(due) });
    } catch (err) {
      this.logger.error(`Expiry sweep failed: ${String(err)}`);
    }
  }

  async sweep(opts: SweepOptions = {}): Promise<SweepResult> {
    const started = performance.now();
    const now = opts.now ?? new Date();
    const txId = TxIds.expirySweep();
    const size = this.config.EXPIRE_BATCH_SIZE;
    let expired = 0;
    let batches = 0;
    let complete = false;
    let outcome = 'partial';
    let durationMs: number;
    try {
      while (!opts.signal?.aborted && (opts.maxBatches === undefined || batches < opts.maxBatches)) {
        const n = await this.tx.inTransaction((em) => this.expireBatch(em, now, size, txId));
        batches++;
        expired += n;
        rowsExpired.inc(n);
        if (n < size) {
          complete = true;
          break;
        }
      }
      if (complete) {
        outcome = 'complete';
        lastSuccess.set(Date.now() / 1000);
      }
    } catch (err) {
      outcome = 'failed';
      throw err;
    } finally {
      durationMs = performance.now() - started;
      runs.inc({ outcome });
      duration.observe({ outcome }, durationMs / 1000);
      this.logger.log(`Expiry sweep ${outcome}: ${expired} coupons expired in ${batches} batches, ${Math.round(durationMs)} ms`);
    }
    return { expired, batches, complete, durationMs };
  }

  /**
   * One batch. SKIP LOCKED leaves alone any coupon a redemption or void holds right now, and the
   * locks taken here make those wait and then see EXPIRED; so the rows locked are exactly the rows
   * the transition changes, and each gets one log row.
   */
  async expireBatch(em: EntityManager, now: Date, size: number, txId: string): Promise<number> {
    const ids = await lockExpired(em, now, size);
    await this.stateMachine.transitAll(em, ids, 'UNUSED', 'EXPIRED', txId, 'expired');
    return ids.length;
  }
}
