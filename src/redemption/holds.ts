import type { EntityManager } from 'typeorm';
import { AppError } from '../common/errors.js';
import type { UserCoupon } from '../ledger/user-coupon.entity.js';
import { execute } from '../database/transaction.service.js';
import { TxIds } from '../ledger/tx-id.js';
import type { StateMachineService } from '../ledger/state-machine.service.js';
import { lockUserCoupon } from '../ledger/user-coupons.js';
import { effectiveHold, Hold, HoldStatus, ReleaseReason } from './hold.entity.js';

/** The hold of (orderNo, userCouponId), locked when `lock`: callers lock the user coupon row first. */
export function findHold(em: EntityManager, orderNo: string, userCouponId: string, lock: boolean): Promise<Hold | null> {
  const qb = em
    .createQueryBuilder(Hold, 'h')
    .where('h.order_no = :orderNo AND h.user_coupon_id = :userCouponId', { orderNo, userCouponId });
  if (lock) qb.setLock('pessimistic_write');
  return qb.getOne();
}

/** Where a released coupon goes: back to UNUSED, or EXPIRED when its validity ended during the hold. */
export const releasedTo = (uc: Pick<UserCoupon, 'expiresAt'>, now: Date) =>
  uc.expiresAt.getTime() <= now.getTime() ? 'EXPIRED' : 'UNUSED';

/** A timed-out hold is recorded as released at its expiry, so storing it changes nothing a reader saw. */
export const releasedAt = (hold: Pick<Hold, 'expiresAt'>, reason: ReleaseReason, now: Date) =>
  reason === 'TIMEOUT' ? hold.expiresAt : now;

/**
 * Closes an ACTIVE hold and gives its coupon back (LOCKED -> UNUSED or EXPIRED), in the caller's
 * transaction, which holds the user coupon's row lock.
 */
export async function releaseHold(
  em: EntityManager,
  stateMachine: StateMachineService,
  uc: Pick<UserCoupon, 'id' | 'expiresAt'>,
  hold: Pick<Hold, 'id' | 'orderNo' | 'expiresAt'>,
  reason: ReleaseReason,
  now: Date,
  cause?: string,
): Promise<void> {
  const closed = await markReleased(em, hold.id, releasedAt(hold, reason, now), reason);
  if (closed !== 1) throw new AppError('STATUS_CONFLICT', `Hold ${hold.id} is no longer active`, { holdId: hold.id });
  const logReason = `hold released: ${reason}${cause ? ` (${cause})` : ''}`;
  await stateMachine.transit(em, uc.id, 'LOCKED', releasedTo(uc, now), TxIds.hold(hold.orderNo), logReason, now);
}

/**
 * A refunded order takes no coupon, so its holds could never be confirmed: their coupons go back now
 * (hold CANCELLED, or TIMEOUT if its time had passed), not when the hold times out. For a refund, and
 * for reconciliation marking an order refunded as its refund did (`cause` says which). The caller
 * holds the order's lock; each coupon is locked before its hold, as a release does. A hold whose
 * coupon is not LOCKED, or is held by another ACTIVE hold too (gaps reconciliation reports as
 * HOLD_WITHOUT_LOCKED, deciding which hold the lock is, for an admin to settle), is left ACTIVE: the
 * refund must not fail over another coupon's state, nor take another order's lock. Answers the
 * holds released and those left.
 */
export async function releaseHoldsOfRefundedOrder(
  em: EntityManager,
  stateMachine: StateMachineService,
  orderNo: string,
  cause: string,
): Promise<{ released: string[]; left: string[] }> {
  const released: string[] = [];
  const left: string[] = [];
  for (const { userCouponId } of await em.findBy(Hold, { orderNo, status: 'ACTIVE' })) {
    const uc = await lockUserCoupon(em, userCouponId, 'exclusive');
    const now = new Date();
    const hold = await findHold(em, orderNo, userCouponId, true);
    if (hold?.status !== 'ACTIVE') continue; // settled since it was listed
    if (uc?.status !== 'LOCKED' || (await otherActiveHold(em, hold))) {
      left.push(String(hold.id));
      continue;
    }
    const reason = effectiveHold(hold, now).status === 'RELEASED' ? 'TIMEOUT' : 'CANCELLED';
    await releaseHold(em, stateMachine, uc, hold, reason, now, `order refunded: ${cause}`);
    released.push(String(hold.id));
  }
  return { released, left };
}

/** Whether another ACTIVE hold names the hold's coupon (invariant 6 broken); the caller holds the coupon's lock. */
async function otherActiveHold(em: EntityManager, hold: Pick<Hold, 'id' | 'userCouponId'>): Promise<boolean> {
  const rows: unknown[] = await em.query(
    `SELECT id FROM redemption_hold WHERE user_coupon_id = ? AND status = 'ACTIVE' AND id <> ? LIMIT 1`,
    [hold.userCouponId, hold.id],
  );
  return rows.length > 0;
}

/** How reconciliation closes an ACTIVE hold. */
export type HoldClosing = Exclude<HoldStatus, 'ACTIVE'>;

/**
 * Reconciliation's close of an ACTIVE hold (CONFIRMED: its order used the coupon; RELEASED:
 * RECONCILIATION), leaving the coupon's status to the caller. Returns the rows changed: 0 when the
 * hold is no longer ACTIVE.
 */
export function closeHoldForReconciliation(em: EntityManager, holdId: string, closeAs: HoldClosing, now: Date): Promise<number> {
  return closeAs === 'CONFIRMED'
    ? execute(em, `UPDATE redemption_hold SET status = 'CONFIRMED' WHERE id = ? AND status = 'ACTIVE'`, [holdId])
    : markReleased(em, holdId, now, 'RECONCILIATION');
}

/** ACTIVE -> RELEASED, a compare-and-set: the rows changed, 0 when the hold is no longer ACTIVE. */
function markReleased(em: EntityManager, holdId: string, at: Date, reason: ReleaseReason): Promise<number> {
  return execute(
    em,
    `UPDATE redemption_hold SET status = 'RELEASED', released_at = ?, release_reason = ? WHERE id = ? AND status = 'ACTIVE'`,
    [at, reason, holdId],
  );
}

/**
 * A LOCKED coupon whose hold timed out is released already to every reader; before it is used,
 * held again or voided, its stored state catches up here (hold TIMEOUT, coupon LOCKED -> UNUSED or
 * EXPIRED), in the same transaction as what comes next.
 */
export async function releaseTimedOutHold(
  em: EntityManager,
  stateMachine: StateMachineService,
  uc: Pick<UserCoupon, 'id' | 'expiresAt'>,
  now: Date,
): Promise<void> {
  const hold = await em
    .createQueryBuilder(Hold, 'h')
    .setLock('pessimistic_write')
    .where(`h.user_coupon_id = :id AND h.status = 'ACTIVE'`, { id: uc.id })
    .getOne();
  if (!hold) throw new AppError('STATUS_CONFLICT', `User coupon ${uc.id} is LOCKED without an active hold; reconciliation reports it`);
  await releaseHold(em, stateMachine, uc, hold, 'TIMEOUT', now);
}
