import { MigrationInterface, QueryRunner } from 'typeorm';

/** A digest of a bulk job's list, so that its Idempotency-Key sent again with another list is refused, not answered with this job. */
export class BulkListDigest1765238400000 implements MigrationInterface {
  name = 'BulkListDigest1765238400000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE issuance_job ADD COLUMN list_digest CHAR(64) NULL AFTER from_stock`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE issuance_job DROP COLUMN list_digest`);
  }
}
