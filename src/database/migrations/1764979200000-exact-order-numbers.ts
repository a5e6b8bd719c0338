import { MigrationInterface, QueryRunner } from 'typeorm';

/** The order and refund number columns and the keys they are part of. */
const COLUMNS: [table: string, columns: string[]][] = [
  ['redemption', ['order_no']],
  ['refund', ['refund_no', 'order_no']],
  ['redemption_hold', ['order_no']],
  ['coupon_order', ['order_no']],
];

/**
 * Order and refund numbers are opaque strings of any characters, compared exactly. utf8mb4_bin is
 * a PAD SPACE collation: it ignores trailing spaces, so `A` and `A ` were one order to the database
 * (one unique key, one lookup) and two to the service: a redemption on `A ` answered A's as a
 * replay, a release on `A ` released A's hold, a refund numbered `X ` answered refund X of another
 * coupon. The binary NO PAD collation (MariaDB's utf8mb4_nopad_bin, MySQL 8's utf8mb4_0900_bin)
 * compares every character. User ids and idempotency keys cannot hold spaces (their patterns), so
 * they keep utf8mb4_bin.
 */
export class ExactOrderNumbers1764979200000 implements MigrationInterface {
  name = 'ExactOrderNumbers1764979200000';

  async up(q: QueryRunner): Promise<void> {
    const [row]: { name: string }[] = await q.query(
      `SELECT collation_name AS name FROM information_schema.collations
       WHERE collation_name IN ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin') ORDER BY collation_name DESC LIMIT 1`,
    );
    if (!row) throw new Error('This server has no binary NO PAD collation for utf8mb4 (MariaDB 10.2+ or MySQL 8 needed)');
    await this.collate(q, row.name);
  }

  /** Fails on a unique key if numbers differing only in trailing spaces were stored meanwhile. */
  async down(q: QueryRunner): Promise<void> {
    await this.collate(q, 'utf8mb4_bin');
  }

  private async collate(q: QueryRunner, collation: string): Promise<void> {
    for (const [table, columns] of COLUMNS) {
      const modify = columns.map((c) => `MODIFY ${c} VARCHAR(64) CHARACTER SET utf8mb4 COLLATE ${collation} NOT NULL`);
      await q.query(`ALTER TABLE ${table} ${modify.join(', ')}`);
    }
  }
}
