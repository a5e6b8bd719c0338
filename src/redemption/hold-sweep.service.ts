import { tickEnd } from '../common/cron-job.js';
import { Injectable, Logger } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { counter, gauge } from '../common/metrics.js';
import { AppConfig } from '../config/app-config.js';
import { LeaseService } from '../database/lease.js';
import { execute, TransactionService } from '../database/transaction.service.js';
import { StateMachineService } from '../ledger/state-machine.service.js';
import { TxIds } from '../ledger/tx-id.js';
import { lockTimedOutHolds } from '../ledger/user-coupons.js';
import { releasedTo } from './holds.js';

const released = counter('hold_sweep_released_total', 'Timed-out holds released by the hold sweep', []);
const runs = counter('hold_sweep_runs_total', 'Hold sweep runs by outcome (skipped: another instance held the lock)', ['outcome']);
const lastSuccess = gauge('hold_sweep_last_complete_timestamp_seconds', 'When a hold sweep last reached the end of the timed-out holds');

export interface HoldSweepResult {
  released: number;
  batches: number;
  complete: boolean;
}

export const HOLD_SWEEP_LEASE = 'hold-sweep';

/**
 * Releases timed-out holds (hold RELEASED with TIMEOUT, coupon LOCKED -> UNUSED, or EXPIRED when its
 * validity ended), in batches of EXPIRE_BATCH_SIZE, each one transaction with its log rows, on one
 * instance at a time (a job lease, like the expiry sweep's). Readers already treat
 * such holds as released, so the sweep only makes the stored state catch up, and stopping anywhere
 * loses nothing. Scheduled by HoldSweepCronJob.
 */
@Injectable()
export class HoldSweepService {
  private readonly logger = new Logger(HoldSweepService.name);

  constructor(
    private readonly tx: TransactionService,
    private readonly stateMachine: StateMachineService,
    private readonly config: AppConfig,
    private readonly leases: LeaseService,
  ) {}

  /**
   * The sweep under the `hold-sweep` lease; it stops at the next batch if the lease is lost or
   * `signal` aborts. Null when another run holds it.
   */
  async runExclusive(now?: Date, signal?: AbortSignal, keptUntil?: Date): Promise<HoldSweepResult | null> {
    const result = await this.leases.runExclusive(
      HOLD_SWEEP_LEASE,
      (lost) => this.sweep(now, signal ? AbortSignal.any([signal, lost]) : lost),
      (r) => (r.complete ? keptUntil : undefined),
    );
    if (result === null) runs.inc({ outcome: 'skipped' });
    return result;
  }

  /** The cron's entry point for the tick due at `due`: never throws (the next tick tries again). */
  async runScheduled(signal: AbortSignal, due: Date): Promise<void> {
    try {
      await this.runExclusive(undefined, signal, tickEnd(due));
    } catch (err) {
      this.logger.error(`Hold sweep failed: ${String(err)}`);
    }
  }

  /** `now` is the cut-off, fixed for the whole run so it ends; `signal` (the lease lost, shutdown) stops it between batches. */
  async sweep(now = new Date(), signal?: AbortSignal): Promise<HoldSweepResult> {
    const txId = TxIds.holdSweep();
    const size = this.config.EXPIRE_BATCH_SIZE;
    const result = { released: 0, batches: 0, complete: false };
    let outcome = 'partial';
    try {
      while (!signal?.aborted) {
        const n = await this.tx.inTransaction((em) => this.releaseBatch(em, now, size, txId));
        result.batches++;
        result.released += n.released;
        released.inc(n.released);
        // A short batch is the end; so is a full one that released nothing (LOCKED coupons without a hold, for reconciliation).
        if (n.locked < size || n.released === 0) {
          result.complete = true;
          outcome = 'complete';
          lastSuccess.set(Date.now() / 1000);
          break;
        }
      }
    } catch (err) {
      outcome = 'failed';
      throw err;
    } finally {
      runs.inc({ outcome });
      if (result.released > 0 || outcome !== 'complete') {
        this.logger.log(`Hold sweep ${outcome}: ${result.released} holds released in ${result.batches} batches`);
      }
    }
    return result;
  }

  /**
   * One batch; returns how many coupons it locked. SKIP LOCKED leaves alone any coupon a
   * confirmation, release or void holds right now (that request settles it; a confirmation in time
   * wins), so the sweep never waits and never deadlocks. Every writer locks the coupon before its
   * hold, so holding the coupons' rows, their ACTIVE holds are free to lock. A LOCKED coupon without
   * an ACTIVE hold is left for reconciliation (LOCKED_WITHOUT_HOLD).
   */
  async releaseBatch(em: EntityManager, now: Date, size: number, txId: string): Promise<{ locked: number; released: number }> {
    const coupons = await lockTimedOutHolds(em, now, size);
    if (coupons.length === 0) return { locked: 0, released: 0 };
    // Only the locked coupons' holds: on idx_hold_status (MariaDB's plan for a long list of coupons)
    // the read also met the hold of a coupon SKIP LOCKED passed over, and waited for the release or
    // refund holding it, which then waited for a coupon this batch holds: a deadlock.
    const holds = (await em.query(
      `SELECT id, user_coupon_id FROM redemption_hold FORCE INDEX (idx_hold_user_coupon)
       WHERE user_coupon_id IN (?) AND status = 'ACTIVE' AND expires_at <= ? FOR UPDATE`,
      [coupons.map((c) => c.id), now],
    )) as { id: string; user_coupon_id: string }[];
    if (holds.length === 0) return { locked: coupons.length, released: 0 };
    const closed = await execute(
      em,
      `UPDATE redemption_hold SET status = 'RELEASED', released_at = expires_at, release_reason = 'TIMEOUT' WHERE id IN (?) AND status = 'ACTIVE'`,
      [holds.map((h) => String(h.id))],
    );
    if (closed !== holds.length) throw new Error(`Hold sweep closed ${closed} of ${holds.length} locked holds; rolled back`);
    const held = new Set(holds.map((h) => String(h.user_coupon_id)));
    const at = new Date();
    for (const to of ['UNUSED', 'EXPIRED'] as const) {
      const ids = coupons.filter((c) => held.has(c.id) && releasedTo(c, at) === to).map((c) => c.id);
      await this.stateMachine.transitAll(em, ids, 'LOCKED', to, txId, 'hold released: TIMEOUT', at);
    }
    return { locked: coupons.length, released: holds.length };
  }
}
