import { MigrationInterface, QueryRunner } from 'typeorm';

/** Bulk lines reached after the coupon's fixed validity ended are skipped as COUPON_EXPIRED, counted here. */
export class BulkSkippedExpired1765152000000 implements MigrationInterface {
  name = 'BulkSkippedExpired1765152000000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE issuance_job ADD COLUMN skipped_expired INT NOT NULL DEFAULT 0 AFTER skipped_duplicate`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE issuance_job DROP COLUMN skipped_expired`);
  }
}
