import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * A delivery sent again by an operator has one attempt, not the retry schedule again: one already
 * DELIVERED after its first attempt would otherwise be retried for a day on failure, holding back
 * its coupon's later events all that time.
 */
export class WebhookFinalAttempt1765411200000 implements MigrationInterface {
  name = 'WebhookFinalAttempt1765411200000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE webhook_delivery ADD COLUMN final_attempt TINYINT(1) NOT NULL DEFAULT 0`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`ALTER TABLE webhook_delivery DROP COLUMN final_attempt`);
  }
}
