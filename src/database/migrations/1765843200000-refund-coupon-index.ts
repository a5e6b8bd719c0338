import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * A coupon's refunds: reconciliation asks, under the coupon's row lock, whether a refund names a
 * lost redemption of it or whether a lost returned coupon had itself been refunded. Without the
 * index each question read the whole refund table.
 */
export class RefundCouponIndex1765843200000 implements MigrationInterface {
  name = 'RefundCouponIndex1765843200000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE refund ADD KEY idx_user_coupon_order (user_coupon_id, order_no)`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE refund DROP KEY idx_user_coupon_order`);
  }
}
