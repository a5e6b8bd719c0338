import { Column, Entity } from 'typeorm';
import { CouponOnOrder } from './redemption.entity.js';

export type HoldStatus = 'ACTIVE' | 'CONFIRMED' | 'RELEASED';
/** CANCELLED: the order service released it; TIMEOUT: it passed expiresAt; RECONCILIATION: an approved compensation closed it. */
export type ReleaseReason = 'CANCELLED' | 'TIMEOUT' | 'RECONCILIATION';

/** A user coupon held for one unpaid order; unique on (order_no, user_coupon_id), like a redemption. */
@Entity('redemption_hold')
export class Hold extends CouponOnOrder {
  @Column({ type: 'varchar', length: 16 })
  status!: HoldStatus;

  @Column({ name: 'expires_at', type: 'datetime', precision: 3 })
  expiresAt!: Date;

  @Column({ name: 'created_at', type: 'datetime', precision: 3 })
  createdAt!: Date;

  @Column({ name: 'released_at', type: 'datetime', precision: 3, nullable: true })
  releasedAt!: Date | null;

  @Column({ name: 'release_reason', type: 'varchar', length: 16, nullable: true })
  releaseReason!: ReleaseReason | null;
}

/** An ACTIVE hold past its expiresAt is released to every reader, before the sweep stores it. */
export function effectiveHold(h: Hold, now = new Date()): Pick<Hold, 'status' | 'releasedAt' | 'releaseReason'> {
  if (h.status === 'ACTIVE' && h.expiresAt.getTime() <= now.getTime())
    return { status: 'RELEASED', releasedAt: h.expiresAt, releaseReason: 'TIMEOUT' };
  return h;
}

export function toHoldView(h: Hold, now = new Date()) {
  const e = effectiveHold(h, now);
  return {
    holdId: h.id,
    userCouponId: h.userCouponId,
    orderNo: h.orderNo,
    userId: h.userId,
    discountCents: h.discountCents,
    status: e.status,
    expiresAt: h.expiresAt.toISOString(),
    createdAt: h.createdAt.toISOString(),
    releasedAt: e.releasedAt ? e.releasedAt.toISOString() : null,
    releaseReason: e.releaseReason,
  };
}
export type HoldView = ReturnType<typeof toHoldView>;
