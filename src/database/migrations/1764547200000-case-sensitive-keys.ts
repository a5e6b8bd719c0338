import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * User ids, idempotency keys, order and refund numbers are opaque, case-sensitive identifiers: under
 * the tables' default utf8mb4_unicode_ci, `alice` and `ALICE` (or keys `k1` and `K1`) were one value
 * to MySQL and two to the service, so a per-user limit or an ownership check could be sidestepped.
 */
export class CaseSensitiveKeys1764547200000 implements MigrationInterface {
  name = 'CaseSensitiveKeys1764547200000';

  async up(q: QueryRunner): Promise<void> {
    await this.collate(q, 'utf8mb4_bin');
  }

  async down(q: QueryRunner): Promise<void> {
    await this.collate(q, 'utf8mb4_unicode_ci');
  }

  private async collate(q: QueryRunner, collation: string): Promise<void> {
    const c = `CHARACTER SET utf8mb4 COLLATE ${collation}`;
    await q.query(`ALTER TABLE user_coupon MODIFY user_id VARCHAR(64) ${c} NOT NULL, MODIFY idempotency_key VARCHAR(128) ${c} NULL`);
    await q.query(`ALTER TABLE redemption MODIFY order_no VARCHAR(64) ${c} NOT NULL, MODIFY user_id VARCHAR(64) ${c} NOT NULL`);
    await q.query(`ALTER TABLE refund MODIFY refund_no VARCHAR(64) ${c} NOT NULL, MODIFY order_no VARCHAR(64) ${c} NOT NULL`);
  }
}
