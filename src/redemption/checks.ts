import type { EntityManager } from 'typeorm';
import { actingFor, type Principal } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import type { AppConfig } from '../config/app-config.js';
import { Coupon } from '../coupon/coupon.entity.js';
import { discountFor, discountOf } from '../coupon/discount.js';
import { effectiveStatus, UserCoupon } from '../ledger/user-coupon.entity.js';

export const userCouponNotFound = () => new AppError('USER_COUPON_NOT_FOUND', 'No such coupon for this user');

/**
 * The user a hold, redemption or release acts for. API.md lets a shopper use their own coupon on any
 * order number, and orders belong to no user, so one could hold or redeem on another customer's
 * order first and leave it no room for a coupon; with REDEMPTIONS_BY_USERS=false only the order
 * service puts coupons on orders and takes them off.
 */
export function orderActor(principal: Principal, userId: string | undefined, config: AppConfig): string {
  if (!config.REDEMPTIONS_BY_USERS && !principal.roles.includes('service'))
    throw new AppError('FORBIDDEN', 'Coupons are put on orders and taken off them by the order service here (REDEMPTIONS_BY_USERS=false)');
  return actingFor(principal, userId);
}

/**
 * What a redemption and a hold check alike before touching an order: the coupon as every reader
 * sees it now is UNUSED (not used, voided, expired, held by another order) and already valid, and
 * the order reaches the threshold. Answers the template and the discount it gives the order.
 */
export async function usableDiscount(
  em: EntityManager,
  uc: UserCoupon,
  orderAmountCents: number,
  now: Date,
): Promise<{ coupon: Coupon; discountCents: number }> {
  const status = effectiveStatus(uc, now);
  if (status === 'USED') throw new AppError('COUPON_ALREADY_USED', 'This coupon was used already');
  if (status === 'LOCKED') {
    throw new AppError('COUPON_LOCKED', 'This coupon is held for another order', { lockedUntil: uc.lockedUntil?.toISOString() });
  }
  if (status === 'VOID') throw new AppError('COUPON_VOID', 'This coupon was voided');
  if (status === 'EXPIRED') throw new AppError('COUPON_EXPIRED', 'This coupon has expired', { expiresAt: uc.expiresAt.toISOString() });
  if (uc.validFrom > now) {
    throw new AppError('COUPON_NOT_YET_VALID', 'This coupon is not valid yet', { validFrom: uc.validFrom.toISOString() });
  }
  const coupon = await em.findOneByOrFail(Coupon, { id: uc.couponId });
  const discountCents = discountFor(discountOf(coupon), orderAmountCents);
  if (discountCents === null) {
    throw new AppError('THRESHOLD_NOT_MET', `Orders from ${coupon.thresholdCents} cents qualify`, {
      thresholdCents: coupon.thresholdCents,
    });
  }
  return { coupon, discountCents };
}
