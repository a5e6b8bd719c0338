import type { Coupon } from './coupon.entity.js';

export type Discount =
  | { type: 'AMOUNT'; thresholdCents: number; amountCents: number }
  | { type: 'PERCENT'; thresholdCents: number; percentOff: number; maxDiscountCents: number | null };

/** A template's discount rule, as the API shows it. */
export function discountOf(
  c: Pick<Coupon, 'discountType' | 'thresholdCents' | 'discountCents' | 'percentOff' | 'maxDiscountCents'>,
): Discount {
  return c.discountType === 'PERCENT'
    ? { type: 'PERCENT', thresholdCents: c.thresholdCents, percentOff: c.percentOff as number, maxDiscountCents: c.maxDiscountCents }
    : { type: 'AMOUNT', thresholdCents: c.thresholdCents, amountCents: c.discountCents as number };
}

/**
 * The one discount computation (holds, redemptions, the usable list): what the rule takes off an
 * order of `orderAmountCents`, never more than the order; null when the order is below the threshold.
 * Integer arithmetic only: a percent of a large amount stays exact.
 */
export function discountFor(d: Discount, orderAmountCents: number): number | null {
  if (orderAmountCents < d.thresholdCents) return null;
  if (d.type === 'AMOUNT') return Math.min(d.amountCents, orderAmountCents);
  const percent = Number((BigInt(orderAmountCents) * BigInt(d.percentOff)) / 100n);
  return Math.min(percent, d.maxDiscountCents ?? percent, orderAmountCents);
}
