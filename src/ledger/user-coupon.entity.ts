import { Column, Entity, EntityManager, PrimaryGeneratedColumn } from 'typeorm';
import type { UserCouponStatus } from './transitions.js';

export type UserCouponSource = 'GRAB' | 'REISSUE' | 'REFUND_RETURN';

@Entity('user_coupon')
export class UserCoupon {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ name: 'coupon_id', type: 'bigint', unsigned: true })
  couponId!: string;

  @Column({ name: 'user_id', type: 'varchar', length: 64 })
  userId!: string;

  /** Stored status; a coupon past expiresAt still UNUSED is EXPIRED to every reader (see effectiveStatus). */
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

  @Column({ name: 'updated_at', type: 'datetime', precision: 3 })
  updatedAt!: Date;
}

export function effectiveStatus(uc: Pick<UserCoupon, 'status' | 'expiresAt'>, now = new Date()): UserCouponStatus {
  return uc.status === 'UNUSED' && uc.expiresAt.getTime() <= now.getTime() ? 'EXPIRED' : uc.status;
}

export function toUserCouponView(uc: UserCoupon, now = new Date()) {
  return {
    id: uc.id,
    couponId: uc.couponId,
    userId: uc.userId,
    status: effectiveStatus(uc, now),
    source: uc.source,
    issuedAt: uc.issuedAt.toISOString(),
    validFrom: uc.validFrom.toISOString(),
    expiresAt: uc.expiresAt.toISOString(),
    usedAt: uc.usedAt ? uc.usedAt.toISOString() : null,
  };
}
export type UserCouponView = ReturnType<typeof toUserCouponView>;

interface UserCouponRow {
  id: string | number;
  coupon_id: string | number;
  user_id: string;
  status: UserCouponStatus;
  source: UserCouponSource;
  from_stock: number;
  idempotency_key: string | null;
  replaces_user_coupon_id: string | number | null;
  reason: string | null;
  issued_at: Date;
  valid_from: Date;
  expires_at: Date;
  used_at: Date | null;
  updated_at: Date;
}

/**
 * The user coupons issued under these (user, idempotency key) pairs, in one query. Plain SQL: on
 * the grab path, building a 500-branch OR through the query builder cost more than the query.
 */
export async function findByKeys(
  em: Pick<EntityManager, 'query'>,
  pairs: readonly { userId: string; key: string }[],
): Promise<UserCoupon[]> {
  if (pairs.length === 0) return [];
  const rows = (await em.query(
    `SELECT * FROM user_coupon WHERE (user_id, idempotency_key) IN (${pairs.map(() => '(?, ?)').join(', ')})`,
    pairs.flatMap((p) => [p.userId, p.key]),
  )) as UserCouponRow[];
  return rows.map((r) =>
    Object.assign(new UserCoupon(), {
      id: String(r.id),
      couponId: String(r.coupon_id),
      userId: r.user_id,
      status: r.status,
      source: r.source,
      fromStock: Boolean(r.from_stock),
      idempotencyKey: r.idempotency_key,
      replacesUserCouponId: r.replaces_user_coupon_id === null ? null : String(r.replaces_user_coupon_id),
      reason: r.reason,
      issuedAt: r.issued_at,
      validFrom: r.valid_from,
      expiresAt: r.expires_at,
      usedAt: r.used_at,
      updatedAt: r.updated_at,
    }),
  );
}
