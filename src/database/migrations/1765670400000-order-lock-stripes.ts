import { MigrationInterface, QueryRunner } from 'typeorm';

/** How many stripes; src/redemption/order.ts picks one by the same number. */
const STRIPES = 1024;

/**
 * The lock every hold, redemption and refund of an order takes first: a stripe row chosen by the
 * order number. Locking the order's own row was not enough: its first requests create it, and
 * when the one that inserted it is refused and rolls back, the others queued on the new row wake up
 * holding gap locks and deadlock on inserting it again. Under load (90 requests on one new order)
 * some lost every retry and answered 503. A stripe row always exists, so waiting for it takes no
 * gap lock, and only its holder ever inserts the order's row.
 *
 * coupon_order.lock_version: every lock of an existing order bumps it. On a Galera cluster a row
 * lock is local to its node and only writes are certified, so two coupons put on one order from
 * two nodes both committed; with the bump both write the order's row and the later one to certify
 * is rolled back and retried, seeing the first.
 */
export class OrderLockStripes1765670400000 implements MigrationInterface {
  name = 'OrderLockStripes1765670400000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(
      `CREATE TABLE IF NOT EXISTS coupon_order_lock (stripe SMALLINT UNSIGNED NOT NULL, PRIMARY KEY (stripe)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci`,
    );
    await q.query(`ALTER TABLE coupon_order ADD COLUMN lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0`);
    const stripes = Array.from({ length: STRIPES }, (_, i) => `(${i})`).join(', ');
    await q.query(`INSERT IGNORE INTO coupon_order_lock (stripe) VALUES ${stripes}`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE coupon_order_lock`);
    await q.query(`ALTER TABLE coupon_order DROP COLUMN lock_version`);
  }
}
