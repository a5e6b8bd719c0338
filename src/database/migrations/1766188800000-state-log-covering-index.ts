import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The state log's index by user coupon carries each step's statuses: reconciliation replays every
 * coupon's log from it (one range read per chunk of 5,000 coupons) instead of fetching each of its
 * rows from the table. At 10,000,000 user coupons with 17,000,000 log rows, the user-coupon audit
 * read alone took 44-45 s instead of 61 s (BENCHMARKS.md). Same leading columns, so every lookup by
 * user coupon still uses it. Online (writes go on while it builds: every grab writes this table);
 * one statement, so an interrupted run leaves the old index or the new one, and running it again
 * builds it again. It took 20 s for those 17,000,000 rows here; on a Galera cluster it blocks the
 * cluster's writes that long (total order isolation), so a large one is better run node by node
 * (rolling schema upgrade) before the deploy.
 */
export class StateLogCoveringIndex1766188800000 implements MigrationInterface {
  name = 'StateLogCoveringIndex1766188800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(
      `ALTER TABLE user_coupon_state_log DROP KEY idx_user_coupon, ADD KEY idx_user_coupon (user_coupon_id, id, from_status, to_status), ALGORITHM=INPLACE, LOCK=NONE`,
    );
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE user_coupon_state_log DROP KEY idx_user_coupon, ADD KEY idx_user_coupon (user_coupon_id, id)`);
  }
}
