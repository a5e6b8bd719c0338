import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * A coupon's user coupons by status, by expiry and by whether they took stock, read from the index
 * alone: the coupon's counts (admin reads, the console every 10 s) and reconciliation's stock audit
 * read from_stock of every one of them by primary key, over 10 s for a coupon of 8 million (503 on a
 * healthy database), and a run's stock audit failed its 30 s statement limit. expires_at keeps the
 * count's correction for unswept expiry in the index too, when a FIXED validity ends for millions
 * at once. Replaces (coupon_id, status), a prefix of it, so a grab writes no more index entries.
 */
export class CouponCountsIndex1765756800000 implements MigrationInterface {
  name = 'CouponCountsIndex1765756800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(
      `ALTER TABLE user_coupon ADD KEY idx_coupon_status_stock (coupon_id, status, expires_at, from_stock), DROP KEY idx_coupon_status`,
    );
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE user_coupon ADD KEY idx_coupon_status (coupon_id, status), DROP KEY idx_coupon_status_stock`);
  }
}
