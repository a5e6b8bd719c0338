import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The Idempotency-Keys of operators' writes that have no natural key (a coupon created, stock
 * changed), each with a digest of its request and the coupon it changed: a retry after a lost
 * answer is answered, not applied twice.
 */
export class AdminRequestKeys1765324800000 implements MigrationInterface {
  name = 'AdminRequestKeys1765324800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`CREATE TABLE admin_request (
      operation VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      idempotency_key VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      request_digest CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      coupon_id BIGINT UNSIGNED NULL,
      created_at DATETIME(3) NOT NULL,
      PRIMARY KEY (operation, idempotency_key)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE admin_request`);
  }
}
