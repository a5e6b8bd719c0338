import { MigrationInterface, QueryRunner } from 'typeorm';

interface Columns {
  table: string;
  /** VARCHAR(64) NOT NULL unless said otherwise. */
  columns: string[];
  length?: number;
  nullable?: boolean;
  /** The collation they had before. */
  before?: string;
  unique: string[][];
}

/** The columns holding an order or refund number (or a key made of one), with their unique keys. */
const COLUMNS: Columns[] = [
  { table: 'redemption', columns: ['order_no'], unique: [['order_no', 'user_coupon_id']] },
  { table: 'refund', columns: ['refund_no', 'order_no'], unique: [['refund_no']] },
  { table: 'redemption_hold', columns: ['order_no'], unique: [['order_no', 'user_coupon_id']] },
  { table: 'coupon_order', columns: ['order_no'], unique: [['order_no']] },
  // `order:<orderNo>` for an ORDER_DISCOUNT_EXCEEDED finding; it had the table's default collation.
  { table: 'discrepancy', columns: ['open_key'], length: 191, nullable: true, before: 'utf8mb4_unicode_ci', unique: [['open_key']] },
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
    for (const c of COLUMNS) await this.collate(q, c, row.name);
    // Orders told apart only now (`A ` used or held where `A` already had its row) get their own
    // row, and an order is refunded when a refund names exactly it.
    await q.query(`INSERT INTO coupon_order (order_no, order_amount_cents, refunded, created_at)
      SELECT x.order_no, MAX(x.order_amount_cents), 0, MIN(x.at)
      FROM (
        SELECT order_no, order_amount_cents, used_at AS at FROM redemption
        UNION ALL
        SELECT order_no, order_amount_cents, created_at FROM redemption_hold
      ) x
      WHERE NOT EXISTS (SELECT 1 FROM coupon_order o WHERE o.order_no = x.order_no)
      GROUP BY x.order_no`);
    await q.query(`UPDATE coupon_order o SET refunded = EXISTS (SELECT 1 FROM refund f WHERE f.order_no = o.order_no)`);
  }

  /** Refused before any change when numbers that differ only in trailing spaces were stored meanwhile. */
  async down(q: QueryRunner): Promise<void> {
    for (const { table, before = 'utf8mb4_bin', unique } of COLUMNS) {
      for (const key of unique) {
        const padded = key.map((c) => (c === 'user_coupon_id' ? c : `${c} COLLATE ${before}`)).join(', ');
        const [clash] = await q.query(`SELECT 1 FROM ${table} WHERE ${key[0]} IS NOT NULL GROUP BY ${padded} HAVING COUNT(*) > 1 LIMIT 1`);
        if (clash) throw new Error(`${table} holds ${key.join(', ')} values that ${before} would make one; fix them first`);
      }
    }
    for (const c of COLUMNS) await this.collate(q, c, c.before ?? 'utf8mb4_bin');
  }

  private async collate(q: QueryRunner, { table, columns, length = 64, nullable = false }: Columns, collation: string): Promise<void> {
    const modify = columns.map(
      (c) => `MODIFY ${c} VARCHAR(${length}) CHARACTER SET utf8mb4 COLLATE ${collation} ${nullable ? 'NULL' : 'NOT NULL'}`,
    );
    await q.query(`ALTER TABLE ${table} ${modify.join(', ')}`);
  }
}
