import { AppError } from '../common/errors.js';
import type { UserCoupon } from '../ledger/user-coupon.entity.js';
import type { Coupon } from './coupon.entity.js';

export interface GrabRequest {
  userId: string;
  key: string;
}

export const identity = (r: GrabRequest) => `${r.userId}\u0000${r.key}`;

/**
 * What either grab strategy decided for one request. A refusal made without looking at the
 * request's key (`keyChecked: false`) is not final: a replay of a grab that succeeded earlier under
 * that key must still answer that coupon, so GrabService looks the key up before refusing.
 */
export type GrabDecision =
  { outcome: 'granted' | 'replayed'; userCoupon: UserCoupon } | { outcome: 'refused'; error: AppError; keyChecked: boolean };

export const refused = (error: AppError, keyChecked: boolean): GrabDecision => ({ outcome: 'refused', error, keyChecked });

/** Grabbing `coupon` has ended by `now`: its window, or its fixed validity before that (grabClosesAt). */
export function grabEnded(coupon: Coupon, now: Date): AppError {
  return new AppError('GRAB_ENDED', 'Grabbing has ended', {
    grabEndAt: coupon.grabEndAt.toISOString(),
    ...(coupon.validityEndAt !== null && coupon.validityEndAt <= now ? { validityEndedAt: coupon.validityEndAt.toISOString() } : {}),
  });
}

export function keyReused(couponId: string): AppError {
  return new AppError('IDEMPOTENCY_KEY_REUSED', 'This Idempotency-Key was already used for another coupon', { couponId });
}

/**
 * A group failed twice on (user, key) pairs committed meanwhile by grabs of other coupons: its
 * requests are each decided again on their own by the per-request path.
 */
export class GroupKeyCollision extends Error {
  constructor(cause: unknown) {
    super('A grab group collided twice with keys committed for other coupons', { cause });
    this.name = 'GroupKeyCollision';
  }
}
