import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * An order's refunds: reconciliation asks whether a refund names an order whose coupon_order row
 * was lost (the row it puts back says so). Without the index each question read the whole refund table.
 */
export class RefundOrderIndex1766102400000 implements MigrationInterface {
  name = 'RefundOrderIndex1766102400000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE refund ADD KEY idx_order (order_no)`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE refund DROP KEY idx_order`);
  }
}
