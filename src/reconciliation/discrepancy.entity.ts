import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import type { DiscrepancyType } from './diagnosis.js';

@Entity('discrepancy')
export class Discrepancy {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ name: 'run_id', type: 'bigint', unsigned: true })
  runId!: string;

  @Column({ type: 'varchar', length: 32 })
  type!: DiscrepancyType;

  @Column({ name: 'coupon_id', type: 'bigint', unsigned: true, nullable: true })
  couponId!: string | null;

  @Column({ name: 'user_coupon_id', type: 'bigint', unsigned: true, nullable: true })
  userCouponId!: string | null;

  @Column({ name: 'redemption_id', type: 'bigint', unsigned: true, nullable: true })
  redemptionId!: string | null;

  /** JSON. */
  @Column({ type: 'text' })
  details!: string;

  /** The entity it is about ("coupon:7", "uc:42", "redemption:9") while undecided; NULL once decided. */
  @Column({ name: 'open_key', type: 'varchar', length: 191, nullable: true })
  openKey!: string | null;

  @Column({ name: 'created_at', type: 'datetime', precision: 3 })
  createdAt!: Date;
}
