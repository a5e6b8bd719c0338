import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import { bigintAsNumber, nullableBigintAsNumber } from '../database/transformers.js';

export type CouponStatus = 'ACTIVE' | 'PAUSED';
export type ValidityType = 'FIXED' | 'RELATIVE';
export type DiscountType = 'AMOUNT' | 'PERCENT';

/** A coupon template: the campaign. Its stock lives in coupon_stock, owned by the ledger module. */
@Entity('coupon')
export class Coupon {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ type: 'varchar', length: 200 })
  name!: string;

  @Column({ type: 'varchar', length: 16 })
  status!: CouponStatus;

  @Column({ name: 'per_user_limit', type: 'int', unsigned: true })
  perUserLimit!: number;

  @Column({ name: 'grab_start_at', type: 'datetime', precision: 3 })
  grabStartAt!: Date;

  @Column({ name: 'grab_end_at', type: 'datetime', precision: 3 })
  grabEndAt!: Date;

  @Column({ name: 'validity_type', type: 'varchar', length: 16 })
  validityType!: ValidityType;

  @Column({ name: 'validity_start_at', type: 'datetime', precision: 3, nullable: true })
  validityStartAt!: Date | null;

  @Column({ name: 'validity_end_at', type: 'datetime', precision: 3, nullable: true })
  validityEndAt!: Date | null;

  @Column({ name: 'validity_days', type: 'int', unsigned: true, nullable: true })
  validityDays!: number | null;

  @Column({ name: 'threshold_cents', type: 'bigint', unsigned: true, transformer: bigintAsNumber })
  thresholdCents!: number;

  @Column({ name: 'discount_type', type: 'varchar', length: 16 })
  discountType!: DiscountType;

  /** AMOUNT: the amount off; null for PERCENT. */
  @Column({ name: 'discount_cents', type: 'bigint', unsigned: true, nullable: true, transformer: nullableBigintAsNumber })
  discountCents!: number | null;

  /** PERCENT: 1..100; null for AMOUNT. */
  @Column({ name: 'percent_off', type: 'int', unsigned: true, nullable: true })
  percentOff!: number | null;

  /** PERCENT: the most it takes off, if capped. */
  @Column({ name: 'max_discount_cents', type: 'bigint', unsigned: true, nullable: true, transformer: nullableBigintAsNumber })
  maxDiscountCents!: number | null;

  /** Whether it may share an order with other coupons (all of them stackable). */
  @Column({ type: 'boolean' })
  stackable!: boolean;

  @Column({ name: 'rate_limit_per_second', type: 'int', unsigned: true, nullable: true })
  rateLimitPerSecond!: number | null;

  @Column({ name: 'return_on_refund', type: 'boolean' })
  returnOnRefund!: boolean;

  @Column({ name: 'created_at', type: 'datetime', precision: 3 })
  createdAt!: Date;

  @Column({ name: 'updated_at', type: 'datetime', precision: 3 })
  updatedAt!: Date;
}

/**
 * When grabbing a coupon ends: its grab window's end, or the end of a fixed validity before it, since
 * a coupon grabbed after that would be issued already EXPIRED.
 */
export function grabClosesAt(c: Pick<Coupon, 'grabEndAt' | 'validityEndAt'>): Date {
  return c.validityEndAt !== null && c.validityEndAt < c.grabEndAt ? c.validityEndAt : c.grabEndAt;
}
