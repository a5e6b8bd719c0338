import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * A refund's two findings (its returned coupon gone, its redemption's id gone) had one open key, so
 * the second waited for the first to be decided. The redemption's now has its own; an open one
 * recorded before takes it, or the next run would propose it a second time.
 */
export class RefundFindingKeys1766016000000 implements MigrationInterface {
  name = 'RefundFindingKeys1766016000000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(
      `UPDATE discrepancy SET open_key = CONCAT('refund-redemption:', SUBSTRING(open_key, LENGTH('refund:') + 1))
       WHERE type = 'REFUND_REDEMPTION_MISSING' AND open_key LIKE 'refund:%'`,
    );
  }

  async down(q: QueryRunner): Promise<void> {
    // One key a refund again: where the refund has both open, the redemption's stops being open (a run finds it again once the other is decided).
    await q.query(
      `UPDATE discrepancy r JOIN discrepancy o ON o.open_key = CONCAT('refund:', SUBSTRING(r.open_key, LENGTH('refund-redemption:') + 1))
       SET r.open_key = NULL WHERE r.type = 'REFUND_REDEMPTION_MISSING' AND r.open_key LIKE 'refund-redemption:%'`,
    );
    await q.query(
      `UPDATE discrepancy SET open_key = CONCAT('refund:', SUBSTRING(open_key, LENGTH('refund-redemption:') + 1))
       WHERE type = 'REFUND_REDEMPTION_MISSING' AND open_key LIKE 'refund-redemption:%'`,
    );
  }
}
