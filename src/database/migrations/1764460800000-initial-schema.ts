import { MigrationInterface, QueryRunner } from 'typeorm';

const TABLE = 'ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci';

/** The whole schema. Timestamps are UTC DATETIME(3); money is BIGINT cents; ids are BIGINT UNSIGNED. */
export class InitialSchema1764460800000 implements MigrationInterface {
  name = 'InitialSchema1764460800000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`CREATE TABLE coupon (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      name VARCHAR(200) NOT NULL,
      status VARCHAR(16) NOT NULL,
      per_user_limit INT UNSIGNED NOT NULL,
      grab_start_at DATETIME(3) NOT NULL,
      grab_end_at DATETIME(3) NOT NULL,
      validity_type VARCHAR(16) NOT NULL,
      validity_start_at DATETIME(3) NULL,
      validity_end_at DATETIME(3) NULL,
      validity_days INT UNSIGNED NULL,
      threshold_cents BIGINT UNSIGNED NOT NULL,
      discount_cents BIGINT UNSIGNED NOT NULL,
      rate_limit_per_second INT UNSIGNED NULL,
      return_on_refund TINYINT(1) NOT NULL DEFAULT 0,
      created_at DATETIME(3) NOT NULL,
      updated_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id)
    ) ${TABLE}`);

    // The hot row: one per coupon, deducted only by conditional UPDATE ... WHERE stock > 0.
    await q.query(`CREATE TABLE coupon_stock (
      coupon_id BIGINT UNSIGNED NOT NULL,
      init_stock BIGINT NOT NULL,
      stock BIGINT NOT NULL,
      updated_at DATETIME(3) NOT NULL,
      PRIMARY KEY (coupon_id),
      CONSTRAINT fk_stock_coupon FOREIGN KEY (coupon_id) REFERENCES coupon (id)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE user_coupon (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      coupon_id BIGINT UNSIGNED NOT NULL,
      user_id VARCHAR(64) NOT NULL,
      status VARCHAR(16) NOT NULL,
      source VARCHAR(16) NOT NULL,
      from_stock TINYINT(1) NOT NULL,
      idempotency_key VARCHAR(128) NULL,
      replaces_user_coupon_id BIGINT UNSIGNED NULL,
      reason VARCHAR(255) NULL,
      issued_at DATETIME(3) NOT NULL,
      valid_from DATETIME(3) NOT NULL,
      expires_at DATETIME(3) NOT NULL,
      used_at DATETIME(3) NULL,
      updated_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id),
      UNIQUE KEY uk_user_idempotency (user_id, idempotency_key),
      KEY idx_coupon_user_source (coupon_id, user_id, source),
      KEY idx_user_status (user_id, status, id),
      KEY idx_status_expires (status, expires_at),
      KEY idx_coupon_status (coupon_id, status),
      KEY idx_updated (updated_at),
      KEY idx_replaces (replaces_user_coupon_id),
      CONSTRAINT fk_uc_coupon FOREIGN KEY (coupon_id) REFERENCES coupon (id)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE user_coupon_state_log (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      user_coupon_id BIGINT UNSIGNED NOT NULL,
      from_status VARCHAR(16) NULL,
      to_status VARCHAR(16) NOT NULL,
      tx_id VARCHAR(191) NOT NULL,
      reason VARCHAR(255) NULL,
      created_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id),
      KEY idx_user_coupon (user_coupon_id, id)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE redemption (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      user_coupon_id BIGINT UNSIGNED NOT NULL,
      order_no VARCHAR(64) NOT NULL,
      user_id VARCHAR(64) NOT NULL,
      order_amount_cents BIGINT UNSIGNED NOT NULL,
      discount_cents BIGINT UNSIGNED NOT NULL,
      status VARCHAR(16) NOT NULL,
      used_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id),
      UNIQUE KEY uk_order_user_coupon (order_no, user_coupon_id),
      KEY idx_user_coupon_status (user_coupon_id, status)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE refund (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      refund_no VARCHAR(64) NOT NULL,
      redemption_id BIGINT UNSIGNED NOT NULL,
      user_coupon_id BIGINT UNSIGNED NOT NULL,
      order_no VARCHAR(64) NOT NULL,
      replacement_user_coupon_id BIGINT UNSIGNED NULL,
      created_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id),
      UNIQUE KEY uk_refund_no (refund_no),
      UNIQUE KEY uk_refund_redemption (redemption_id)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE reconciliation_run (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      status VARCHAR(16) NOT NULL,
      mode VARCHAR(16) NOT NULL,
      triggered_by VARCHAR(64) NOT NULL,
      started_at DATETIME(3) NOT NULL,
      finished_at DATETIME(3) NULL,
      checked BIGINT UNSIGNED NOT NULL DEFAULT 0,
      discrepancies INT UNSIGNED NOT NULL DEFAULT 0,
      error VARCHAR(1000) NULL,
      PRIMARY KEY (id),
      KEY idx_status_started (status, started_at)
    ) ${TABLE}`);

    // open_key is the discrepancy's fingerprint while it is open and NULL once decided, so a unique
    // key keeps one open record per inconsistency across runs.
    await q.query(`CREATE TABLE discrepancy (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      run_id BIGINT UNSIGNED NOT NULL,
      type VARCHAR(32) NOT NULL,
      coupon_id BIGINT UNSIGNED NULL,
      user_coupon_id BIGINT UNSIGNED NULL,
      redemption_id BIGINT UNSIGNED NULL,
      details TEXT NOT NULL,
      open_key VARCHAR(191) NULL,
      created_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id),
      UNIQUE KEY uk_open_key (open_key),
      KEY idx_run (run_id)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE compensation (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      discrepancy_id BIGINT UNSIGNED NOT NULL,
      action VARCHAR(32) NOT NULL,
      params TEXT NOT NULL,
      status VARCHAR(16) NOT NULL,
      decided_by VARCHAR(64) NULL,
      decision_reason VARCHAR(500) NULL,
      decided_at DATETIME(3) NULL,
      result TEXT NULL,
      created_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id),
      KEY idx_status (status, id),
      KEY idx_discrepancy (discrepancy_id)
    ) ${TABLE}`);
  }

  async down(q: QueryRunner): Promise<void> {
    for (const t of [
      'compensation',
      'discrepancy',
      'reconciliation_run',
      'refund',
      'redemption',
      'user_coupon_state_log',
      'user_coupon',
      'coupon_stock',
      'coupon',
    ]) {
      await q.query(`DROP TABLE ${t}`);
    }
  }
}
