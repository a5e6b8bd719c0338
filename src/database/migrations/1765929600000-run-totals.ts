import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * What a completed reconciliation run counted as it read the ledger: the user coupons, the uses
 * and the discount they gave, and the uses refunded and their discount. NULL for a run that did not
 * complete, and for the runs before this.
 */
export class RunTotals1765929600000 implements MigrationInterface {
  name = 'RunTotals1765929600000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(
      `ALTER TABLE reconciliation_run
         ADD COLUMN user_coupons BIGINT UNSIGNED NULL,
         ADD COLUMN redemptions BIGINT UNSIGNED NULL,
         ADD COLUMN discount_cents BIGINT UNSIGNED NULL,
         ADD COLUMN refunded_redemptions BIGINT UNSIGNED NULL,
         ADD COLUMN refunded_discount_cents BIGINT UNSIGNED NULL`,
    );
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(
      `ALTER TABLE reconciliation_run DROP COLUMN user_coupons, DROP COLUMN redemptions, DROP COLUMN discount_cents,
         DROP COLUMN refunded_redemptions, DROP COLUMN refunded_discount_cents`,
    );
  }
}
