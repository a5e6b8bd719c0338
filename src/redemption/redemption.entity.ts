import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import { bigintAsNumber } from '../database/transformers.js';

/** The columns a hold and a redemption share: one user coupon on one order, the amount and the discount. */
export abstract class CouponOnOrder {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ name: 'user_coupon_id', type: 'bigint', unsigned: true })
  userCouponId!: string;

  @Column({ name: 'order_no', type: 'varchar', length: 64 })
  orderNo!: string;

  @Column({ name: 'user_id', type: 'varchar', length: 64 })
  userId!: string;

  @Column({ name: 'order_amount_cents', type: 'bigint', unsigned: true, transformer: bigintAsNumber })
  orderAmountCents!: number;

  @Column({ name: 'discount_cents', type: 'bigint', unsigned: true, transformer: bigintAsNumber })
  discountCents!: number;
}

/** One use of a user coupon on an order; unique on (order_no, user_coupon_id). */
@Entity('redemption')
export class Redemption extends CouponOnOrder {
  @Column({ type: 'varchar', length: 16 })
  status!: 'USED';

  @Column({ name: 'used_at', type: 'datetime', precision: 3 })
  usedAt!: Date;
}

/** A refund of a redeemed order; when the template returns coupons on refund, it links the replacement. */
@Entity('refund')
export class Refund {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ name: 'refund_no', type: 'varchar', length: 64 })
  refundNo!: string;

  @Column({ name: 'redemption_id', type: 'bigint', unsigned: true })
  redemptionId!: string;

  @Column({ name: 'user_coupon_id', type: 'bigint', unsigned: true })
  userCouponId!: string;

  @Column({ name: 'order_no', type: 'varchar', length: 64 })
  orderNo!: string;

  @Column({ name: 'replacement_user_coupon_id', type: 'bigint', unsigned: true, nullable: true })
  replacementUserCouponId!: string | null;

  @Column({ name: 'created_at', type: 'datetime', precision: 3 })
  createdAt!: Date;
}
