import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import type { UserCouponStatus } from './transitions.js';

export type UserCouponSource = 'GRAB' | 'BULK' | 'REISSUE' | 'REFUND_RETURN';

@Entity('user_coupon')
export class UserCoupon {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ name: 'coupon_id', type: 'bigint', unsigned: true })
  couponId!: string;

  @Column({ name: 'user_id', type: 'varchar', length: 64 })
  userId!: string;

  /**
   * Stored status; a coupon past expiresAt still UNUSED is EXPIRED to every reader, and a LOCKED one
   * past lockedUntil is released to every reader (see effectiveStatus).
   */
  @Column({ type: 'varchar', length: 16 })
  status!: UserCouponStatus;

  @Column({ type: 'varchar', length: 16 })
  source!: UserCouponSource;

  /** Whether issuing it took one unit of coupon_stock (grabs and fromStock reissues). */
  @Column({ name: 'from_stock', type: 'boolean' })
  fromStock!: boolean;

  @Column({ name: 'idempotency_key', type: 'varchar', length: 128, nullable: true })
  idempotencyKey!: string | null;

  @Column({ name: 'replaces_user_coupon_id', type: 'bigint', unsigned: true, nullable: true })
  replacesUserCouponId!: string | null;

  @Column({ type: 'varchar', length: 255, nullable: true })
  reason!: string | null;

  @Column({ name: 'issued_at', type: 'datetime', precision: 3 })
  issuedAt!: Date;

  @Column({ name: 'valid_from', type: 'datetime', precision: 3 })
  validFrom!: Date;

  @Column({ name: 'expires_at', type: 'datetime', precision: 3 })
  expiresAt!: Date;

  @Column({ name: 'used_at', type: 'datetime', precision: 3, nullable: true })
  usedAt!: Date | null;

  /** While LOCKED: when its ACTIVE hold times out (the hold's expiresAt). Meaningless in other states. */
  @Column({ name: 'locked_until', type: 'datetime', precision: 3, nullable: true })
  lockedUntil!: Date | null;

  @Column({ name: 'updated_at', type: 'datetime', precision: 3, onUpdate: 'CURRENT_TIMESTAMP(3)' })
  updatedAt!: Date;
}

/**
 * The status every reader sees: a timed-out hold is already released (to UNUSED, or EXPIRED when
 * the coupon's validity ended meanwhile), and an UNUSED coupon past its expiry is already EXPIRED;
 * the sweeps only make the stored status catch up.
 */
export function effectiveStatus(uc: Pick<UserCoupon, 'status' | 'expiresAt' | 'lockedUntil'>, now = new Date()): UserCouponStatus {
  const t = now.getTime();
  if (uc.status === 'LOCKED' && (uc.lockedUntil === null || uc.lockedUntil.getTime() > t)) return 'LOCKED';
  if (uc.status === 'UNUSED' || uc.status === 'LOCKED') return uc.expiresAt.getTime() <= t ? 'EXPIRED' : 'UNUSED';
  return uc.status;
}

/**
 * effectiveStatus in SQL, for the user coupon table under `alias`. `now` is the placeholder of the
 * current time: with the default `?` bind it twice; a named one (`:now`) once.
 */
export const effectiveStatusSql = (alias: string, now = '?') =>
  `(CASE WHEN ${alias}.status = 'LOCKED' AND (${alias}.locked_until IS NULL OR ${alias}.locked_until > ${now}) THEN 'LOCKED'
         WHEN ${alias}.status IN ('UNUSED', 'LOCKED') THEN IF(${alias}.expires_at <= ${now}, 'EXPIRED', 'UNUSED')
         ELSE ${alias}.status END)`;

function view(uc: UserCoupon, status: UserCouponStatus, usedAt: Date | null) {
  return {
    id: uc.id,
    couponId: uc.couponId,
    userId: uc.userId,
    status,
    source: uc.source,
    issuedAt: uc.issuedAt.toISOString(),
    validFrom: uc.validFrom.toISOString(),
    expiresAt: uc.expiresAt.toISOString(),
    usedAt: usedAt ? usedAt.toISOString() : null,
    replacesUserCouponId: uc.replacesUserCouponId,
  };
}
export type UserCouponView = ReturnType<typeof view>;

/** The coupon as it is now. */
export function toUserCouponView(uc: UserCoupon, now = new Date()): UserCouponView {
  return view(uc, effectiveStatus(uc, now), uc.usedAt);
}

/**
 * The coupon as the answer that issued it showed it: status as of its issuance (UNUSED, or EXPIRED
 * when issued past its validity), never used. The answers of the requests that issue coupons (grab,
 * reissue, a refund's replacement) are this, so a replay repeats the first answer whatever happened
 * to the coupon since (API.md); the reads show it as it is now.
 */
export function toIssuedView(uc: UserCoupon): UserCouponView {
  return view(uc, effectiveStatus({ status: 'UNUSED', expiresAt: uc.expiresAt, lockedUntil: null }, uc.issuedAt), null);
}
