import { Column, Entity, PrimaryColumn } from 'typeorm';
import { bigintAsNumber } from '../database/transformers.js';

@Entity('coupon_stock')
export class CouponStock {
  @PrimaryColumn({ name: 'coupon_id', type: 'bigint', unsigned: true })
  couponId!: string;

  @Column({ name: 'init_stock', type: 'bigint', transformer: bigintAsNumber })
  initStock!: number;

  @Column({ type: 'bigint', transformer: bigintAsNumber })
  stock!: number;

  @Column({ name: 'updated_at', type: 'datetime', precision: 3 })
  updatedAt!: Date;
}
