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
    // One key a refund again: a refund with both findings open cannot keep both, and closing one here would leave its proposal pending beside the next run's.
    const both = (await q.query(
      `SELECT r.open_key AS k FROM discrepancy r JOIN discrepancy o ON o.open_key = CONCAT('refund:', SUBSTRING(r.open_key, LENGTH('refund-redemption:') + 1))
       WHERE r.type = 'REFUND_REDEMPTION_MISSING' AND r.open_key LIKE 'refund-redemption:%' LIMIT 5`,
    )) as { k: string }[];
    if (both.length > 0) {
      throw new Error(
        `Refunds with both findings open (${both.map((b) => b.k).join(', ')}): approve or reject one of each before going back past this migration.`,
      );
    }
    await q.query(
      `UPDATE discrepancy SET open_key = CONCAT('refund:', SUBSTRING(open_key, LENGTH('refund-redemption:') + 1))
       WHERE type = 'REFUND_REDEMPTION_MISSING' AND open_key LIKE 'refund-redemption:%'`,
    );
  }
}
