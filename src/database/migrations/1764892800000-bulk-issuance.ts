import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Bulk (targeted) issuance: a job, the list it was given (stored line by line as it streams in, so
 * a million-line upload is never held in memory and a restarted runner reads on where it stopped),
 * and the lines it skipped with their reason. The coupons themselves are ordinary user_coupon rows
 * with source BULK and the idempotency key `bulk:<jobId>`: the (user_id, idempotency_key) unique
 * index makes "at most one coupon per user per job" a fact of the database.
 */
export class BulkIssuance1764892800000 implements MigrationInterface {
  name = 'BulkIssuance1764892800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`CREATE TABLE issuance_job (
      id BIGINT NOT NULL AUTO_INCREMENT,
      coupon_id BIGINT NOT NULL,
      idempotency_key VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      reason VARCHAR(255) NOT NULL,
      from_stock TINYINT(1) NOT NULL,
      status VARCHAR(16) NOT NULL,
      total INT NOT NULL DEFAULT 0,
      next_line INT NOT NULL DEFAULT 0,
      issued INT NOT NULL DEFAULT 0,
      skipped_user_limit INT NOT NULL DEFAULT 0,
      skipped_sold_out INT NOT NULL DEFAULT 0,
      skipped_invalid INT NOT NULL DEFAULT 0,
      skipped_duplicate INT NOT NULL DEFAULT 0,
      created_by VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
      created_at DATETIME(3) NOT NULL,
      started_at DATETIME(3) NULL,
      finished_at DATETIME(3) NULL,
      updated_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id),
      UNIQUE KEY uq_issuance_job_key (idempotency_key),
      KEY idx_issuance_job_status (status, id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci`);
    await q.query(`CREATE TABLE issuance_job_line (
      job_id BIGINT NOT NULL,
      line_no INT NOT NULL,
      user_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
      PRIMARY KEY (job_id, line_no),
      KEY idx_issuance_line_user (job_id, user_id, line_no)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`);
    await q.query(`CREATE TABLE issuance_job_skip (
      job_id BIGINT NOT NULL,
      line_no INT NOT NULL,
      user_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
      reason VARCHAR(32) NOT NULL,
      PRIMARY KEY (job_id, line_no)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE issuance_job_skip`);
    await q.query(`DROP TABLE issuance_job_line`);
    await q.query(`DROP TABLE issuance_job`);
  }
}
