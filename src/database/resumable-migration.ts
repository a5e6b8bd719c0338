import type { MigrationInterface, QueryRunner } from 'typeorm';
import { errnoOf, isDatabaseOutage } from '../common/db-errors.js';

/**
 * How far a migration got: the number of its changing statements that took effect. MySQL and
 * MariaDB commit every DDL statement on its own, so "each migration in a transaction" undoes only
 * its DML: a migration stopped halfway (a crash, a SIGTERM of a rolling deploy, a lost connection)
 * used to leave its first tables or columns in place and itself unrecorded, and every later start
 * failed on "table already exists". Like TypeORM's `migrations` table, this one is not part of the
 * migrated schema.
 */
const PROGRESS_DDL = `CREATE TABLE IF NOT EXISTS migration_progress (
  name VARCHAR(255) NOT NULL PRIMARY KEY,
  steps INT UNSIGNED NOT NULL,
  in_doubt TINYINT(1) NOT NULL DEFAULT 0
) ENGINE=InnoDB`;

/** What a DDL statement that already took effect answers when it is sent again. */
const ALREADY_APPLIED = new Set([
  1050, // table already exists
  1051, // unknown table (DROP TABLE)
  1054, // unknown column (a column dropped or renamed)
  1060, // duplicate column name
  1061, // duplicate key name
  1091, // can't DROP: column or key does not exist
  1359, // trigger already exists
  1360, // trigger does not exist
  1826, // duplicate foreign key constraint name
]);

/** Reads run every time: their results steer the migration, and they change nothing. */
const READ = /^\s*(SELECT|SHOW)\b/i;
/** Statements the server commits on their own (an implicit commit before and after). */
const DDL = /^\s*(CREATE|ALTER|DROP|RENAME|TRUNCATE)\b/i;

/**
 * The migration, resumable where it stopped. Its changing statements are counted in
 * migration_progress, the count written after each one: a DML statement and its count in one
 * transaction of their own, so both or neither took effect; a DDL statement commits itself, so a
 * stop can fall between it and its count. Such a DDL is marked in doubt before it is sent, and the
 * mark cleared with its count, or when the server refuses it (DDL is atomic on MariaDB 10.6+ and
 * MySQL 8: refused is not applied). Only a statement still in doubt on the next run, the first one
 * not counted, may answer "already applied" (ALREADY_APPLIED), which then counts as done; a real
 * error (a column a drifted schema lacks) fails every run alike. The counted ones are skipped. The
 * count is dropped in the transaction that records the migration as run.
 */
export function resumable<M extends MigrationInterface>(Migration: new () => M): new () => M {
  const Resumable = class extends (Migration as new () => MigrationInterface) {
    override async up(q: QueryRunner): Promise<void> {
      const name = this.name ?? Migration.name;
      await q.query(PROGRESS_DDL);
      const [row] = (await q.query('SELECT steps, in_doubt FROM migration_progress WHERE name = ?', [name])) as {
        steps: number;
        in_doubt: number;
      }[];
      const done = row ? Number(row.steps) : 0;
      if (!row) await q.query('INSERT INTO migration_progress (name, steps) VALUES (?, 0)', [name]);
      let step = 0;
      const query = async (sql: string, params?: unknown[]): Promise<unknown> => {
        if (READ.test(sql)) return q.query(sql, params);
        const current = step++;
        if (current < done) return [];
        const count = () => q.query('UPDATE migration_progress SET steps = ?, in_doubt = 0 WHERE name = ?', [current + 1, name]);
        if (!DDL.test(sql)) {
          // After a DDL statement the session is back in autocommit: the transaction is opened here.
          await q.query('START TRANSACTION');
          const result: unknown = await q.query(sql, params);
          await count();
          await q.query('COMMIT');
          return result;
        }
        // Outside a DML step the session is in autocommit: the mark is committed before the DDL is sent.
        await q.query('UPDATE migration_progress SET in_doubt = 1 WHERE name = ?', [name]);
        let result: unknown = [];
        try {
          result = await q.query(sql, params);
        } catch (err) {
          const inDoubt = row && Number(row.in_doubt) === 1 && current === done;
          if (!(inDoubt && ALREADY_APPLIED.has(errnoOf(err) ?? 0))) {
            // Refused by the server, so not applied; a lost connection leaves the mark.
            if (!isDatabaseOutage(err)) await q.query('UPDATE migration_progress SET in_doubt = 0 WHERE name = ?', [name]);
            throw err;
          }
        }
        await count();
        return result;
      };
      await super.up(
        new Proxy(q, {
          get: (target, prop) => {
            if (prop === 'query') return query;
            const value: unknown = Reflect.get(target, prop, target);
            return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
          },
        }),
      );
      // TypeORM then records the migration and commits: both, or neither.
      await q.query('START TRANSACTION');
      await q.query('DELETE FROM migration_progress WHERE name = ?', [name]);
    }
  };
  Object.defineProperty(Resumable, 'name', { value: Migration.name });
  return Resumable as unknown as new () => M;
}
