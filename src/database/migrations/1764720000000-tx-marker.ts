import { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * One row per database connection the service opened: every write transaction stamps its own
 * connection's row with its id first thing. When the answer to a COMMIT is lost, another
 * connection reads that row to learn whether the transaction committed (src/database/outcome.ts).
 * Rows are per connection, not per transaction, so the table stays small and no two transactions
 * ever write the same row (no lock waits, no Galera certification conflicts on it).
 */
export class TxMarker1764720000000 implements MigrationInterface {
  name = 'TxMarker1764720000000';

  async up(q: QueryRunner): Promise<void> {
    await q.query(`CREATE TABLE tx_marker (
      slot VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      tx_id CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      updated_at DATETIME(3) NOT NULL,
      PRIMARY KEY (slot)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`);
  }

  async down(q: QueryRunner): Promise<void> {
    await q.query(`DROP TABLE tx_marker`);
  }
}
