import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Every refund number the service has answered, with the refund it named: a refund's own, and one
 * sent for a redemption refunded already under another number, which is answered with that refund.
 * The second kind was not kept, so the same number could later make a new refund of another coupon.
 * One table holds both, so that its primary key is the one place a number is taken.
 */
export class RefundNumbers1765497600000 implements MigrationInterface {
  name = 'RefundNumbers1765497600000';

  async up(q: QueryRunner): Promise<void> {
    // The collation refund.refund_no has (NO PAD binary: utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL 8).
    const [column] = (await q.query(
      `SELECT collation_name AS name FROM information_schema.columns
       WHERE table_schema = DATABASE() AND table_name = 'refund' AND column_name = 'refund_no'`,
    )) as { name: string }[];
    await q.query(`CREATE TABLE refund_number (
      refund_no VARCHAR(64) CHARACTER SET utf8mb4 COLLATE ${column.name} NOT NULL,
      refund_id BIGINT UNSIGNED NOT NULL,
      PRIMARY KEY (refund_no),
      KEY idx_refund (refund_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`);
    await q.query(`INSERT INTO refund_number (refund_no, refund_id) SELECT refund_no, id FROM refund`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE refund_number`);
  }
}
