import { MigrationInterface, QueryRunner } from 'typeorm';

const TABLE = 'ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci';

/**
 * Webhook endpoints, one delivery per (endpoint, state-log row), the attempts of each delivery, and
 * the relay's durable cursor into the state log. The cursor starts at the log's current end: rows
 * written before webhooks existed had no subscriber to be delivered to.
 */
export class Webhooks1764806400000 implements MigrationInterface {
  name = 'Webhooks1764806400000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`CREATE TABLE webhook_endpoint (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      url VARCHAR(2048) NOT NULL,
      events VARCHAR(512) NULL,
      description VARCHAR(255) NULL,
      secret VARCHAR(100) NOT NULL,
      enabled TINYINT(1) NOT NULL,
      failed_in_row INT UNSIGNED NOT NULL DEFAULT 0,
      disabled_reason VARCHAR(255) NULL,
      disabled_at DATETIME(3) NULL,
      created_at DATETIME(3) NOT NULL,
      updated_at DATETIME(3) NOT NULL,
      PRIMARY KEY (id)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE webhook_delivery (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      endpoint_id BIGINT UNSIGNED NOT NULL,
      log_id BIGINT UNSIGNED NOT NULL,
      user_coupon_id BIGINT UNSIGNED NOT NULL,
      event_type VARCHAR(32) NOT NULL,
      payload TEXT NOT NULL,
      event_at DATETIME(3) NOT NULL,
      status VARCHAR(16) NOT NULL,
      attempts INT UNSIGNED NOT NULL DEFAULT 0,
      next_attempt_at DATETIME(3) NULL,
      last_status_code SMALLINT UNSIGNED NULL,
      last_error VARCHAR(255) NULL,
      created_at DATETIME(3) NOT NULL,
      delivered_at DATETIME(3) NULL,
      PRIMARY KEY (id),
      UNIQUE KEY uq_endpoint_log (endpoint_id, log_id),
      KEY idx_due (endpoint_id, status, next_attempt_at),
      KEY idx_coupon_order (endpoint_id, user_coupon_id, log_id),
      KEY idx_pending (status, attempts, event_at)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE webhook_delivery_attempt (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
      delivery_id BIGINT UNSIGNED NOT NULL,
      attempted_at DATETIME(3) NOT NULL,
      status_code SMALLINT UNSIGNED NULL,
      error VARCHAR(255) NULL,
      duration_ms INT UNSIGNED NOT NULL,
      PRIMARY KEY (id),
      KEY idx_delivery (delivery_id, id)
    ) ${TABLE}`);

    await q.query(`CREATE TABLE webhook_relay_cursor (
      name VARCHAR(32) NOT NULL,
      log_id BIGINT UNSIGNED NOT NULL,
      updated_at DATETIME(3) NOT NULL,
      PRIMARY KEY (name)
    ) ${TABLE}`);
    await q.query(
      `INSERT INTO webhook_relay_cursor (name, log_id, updated_at) SELECT 'relay', COALESCE(MAX(id), 0), UTC_TIMESTAMP(3) FROM user_coupon_state_log`,
    );
  }

  async down(q: QueryRunner): Promise<void> {
    for (const t of ['webhook_relay_cursor', 'webhook_delivery_attempt', 'webhook_delivery', 'webhook_endpoint']) {
      await q.query(`DROP TABLE ${t}`);
    }
  }
}
