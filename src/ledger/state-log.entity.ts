import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import type { UserCouponStatus } from './transitions.js';

@Entity('user_coupon_state_log')
export class StateLog {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ name: 'user_coupon_id', type: 'bigint', unsigned: true })
  userCouponId!: string;

  @Column({ name: 'from_status', type: 'varchar', length: 16, nullable: true })
  fromStatus!: UserCouponStatus | null;

  @Column({ name: 'to_status', type: 'varchar', length: 16 })
  toStatus!: UserCouponStatus;

  @Column({ name: 'tx_id', type: 'varchar', length: 191 })
  txId!: string;

  @Column({ type: 'varchar', length: 255, nullable: true })
  reason!: string | null;

  @Column({ name: 'created_at', type: 'datetime', precision: 3 })
  createdAt!: Date;
}
