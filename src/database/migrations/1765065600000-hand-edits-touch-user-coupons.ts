import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The incremental reconciliation replays the state log of the user coupons whose updated_at moved
 * since the last complete run. The service sets updated_at on every status change, but a status
 * changed by hand (`UPDATE user_coupon SET status = ...`) left it alone, so the nightly runs never
 * saw it; with ON UPDATE the database moves it for any statement that changes the row and does not
 * set it itself. A metadata change: MariaDB 10.11 does it with ALGORITHM=INSTANT (checked), so it
 * takes no time however large the table.
 */
export class HandEditsTouchUserCoupons1765065600000 implements MigrationInterface {
  name = 'HandEditsTouchUserCoupons1765065600000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE user_coupon MODIFY updated_at DATETIME(3) NOT NULL ON UPDATE CURRENT_TIMESTAMP(3)`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE user_coupon MODIFY updated_at DATETIME(3) NOT NULL`);
  }
}
