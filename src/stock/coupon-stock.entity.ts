import { Column, Entity, PrimaryColumn } from 'typeorm';

const asNumber = { to: (v: number) => v, from: (v: string) => Number(v) };

@Entity('coupon_stock')
export class CouponStock {
  @PrimaryColumn({ name: 'coupon_id', type: 'bigint', unsigned: true })
  couponId!: string;

  @Column({ name: 'init_stock', type: 'bigint', transformer: asNumber })
  initStock!: number;

  @Column({ type: 'bigint', transformer: asNumber })
  stock!: number;

  @Column({ name: 'updated_at', type: 'datetime', precision: 3 })
  updatedAt!: Date;
}
