import { MigrationInterface, QueryRunner } from 'typeorm';

const TABLE = 'ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci';
const BIN = 'CHARACTER SET utf8mb4 COLLATE utf8mb4_bin';

/**
 * Checkout holds, discount types and per-order rules.
 * - user_coupon.locked_until: the expiry of the ACTIVE hold of a LOCKED coupon, on the coupon row
 *   itself, so every reader can tell a timed-out hold (shown as released) without a join, and the
 *   hold sweep finds its work on an index, like the expiry sweep.
 * - redemption_hold: one per (order_no, user_coupon_id), like redemption.
 * - coupon_order: one row per order that carries a coupon; every hold, redemption and refund of an
 *   order locks it first, so two coupons racing onto one order are decided one after the other.
 *   Orders already redeemed are backfilled so the rules apply to them too.
 */
export class CheckoutHolds1764633600000 implements MigrationInterface {
  name = 'CheckoutHolds1764633600000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE user_coupon ADD COLUMN locked_until DATETIME(3) NULL, ADD KEY idx_status_locked (status, locked_until)`);
    await q.query(`ALTER TABLE coupon
      ADD COLUMN discount_type VARCHAR(16) NOT NULL DEFAULT 'AMOUNT',
      MODIFY discount_cents BIGINT UNSIGNED NULL,
      ADD COLUMN percent_off INT UNSIGNED NULL,
      ADD COLUMN max_discount_cents BIGINT UNSIGNED NULL,
      ADD COLUMN stackable TINYINT(1) NOT NULL DEFAULT 0,
      ADD KEY idx_live (status, grab_end_at)`);
    await q.query(`CREATE TABLE redemption_hold (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      user_coupon_id BIGINT UNSIGNED NOT NULL,
      order_no VARCHAR(64) ${BIN} NOT NULL,
      user_id VARCHAR(64) ${BIN} NOT NULL,
      order_amount_cents BIGINT UNSIGNED NOT NULL,
      discount_cents BIGINT UNSIGNED NOT NULL,
      status VARCHAR(16) NOT NULL,
      expires_at DATETIME(3) NOT NULL,
      created_at DATETIME(3) NOT NULL,
      released_at DATETIME(3) NULL,
      release_reason VARCHAR(16) NULL,
      PRIMARY KEY (id),
      UNIQUE KEY uk_hold_order_user_coupon (order_no, user_coupon_id),
      KEY idx_hold_user_coupon (user_coupon_id, status),
      KEY idx_hold_status (status, expires_at)
    ) ${TABLE}`);
    await q.query(`CREATE TABLE coupon_order (
      order_no VARCHAR(64) ${BIN} NOT NULL,
      order_amount_cents BIGINT UNSIGNED NOT NULL,
      refunded TINYINT(1) NOT NULL DEFAULT 0,
      created_at DATETIME(3) NOT NULL,
      PRIMARY KEY (order_no)
    ) ${TABLE}`);
    await q.query(`INSERT INTO coupon_order (order_no, order_amount_cents, refunded, created_at)
      SELECT r.order_no, MAX(r.order_amount_cents), MAX(f.id IS NOT NULL), MIN(r.used_at)
      FROM redemption r LEFT JOIN refund f ON f.order_no = r.order_no GROUP BY r.order_no`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE coupon_order`);
    await q.query(`DROP TABLE redemption_hold`);
    await q.query(`UPDATE coupon SET discount_cents = 0 WHERE discount_cents IS NULL`);
    await q.query(`ALTER TABLE coupon DROP KEY idx_live, DROP COLUMN stackable, DROP COLUMN max_discount_cents, DROP COLUMN percent_off,
      MODIFY discount_cents BIGINT UNSIGNED NOT NULL, DROP COLUMN discount_type`);
    await q.query(`ALTER TABLE user_coupon DROP KEY idx_status_locked, DROP COLUMN locked_until`);
  }
}
