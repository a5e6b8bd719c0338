import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * A job's skipped lines of one reason, in line order (the skipped list and its CSV filtered by
 * reason): without it, the lines of a rare reason are found by reading all of the job's skips by
 * primary key, up to a million rows for each page.
 */
export class SkipReasonIndex1765584000000 implements MigrationInterface {
  name = 'SkipReasonIndex1765584000000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE issuance_job_skip ADD KEY idx_issuance_skip_reason (job_id, reason, line_no)`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE issuance_job_skip DROP KEY idx_issuance_skip_reason`);
  }
}
