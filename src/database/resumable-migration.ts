import { createHash } from 'node:crypto';
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
  in_doubt TINYINT(1) NOT NULL DEFAULT 0,
  digest CHAR(64) NULL,
  doubt_digest CHAR(64) NULL
) ENGINE=InnoDB`;
/**
 * Columns the first versions of this file did not make: a row without a digest is resumed by
 * position alone, one without doubt_digest takes its statement in doubt as unedited.
 */
const ADD_COLUMNS = [
  'ALTER TABLE migration_progress ADD COLUMN digest CHAR(64) NULL',
  'ALTER TABLE migration_progress ADD COLUMN doubt_digest CHAR(64) NULL',
];
const ER_DUP_FIELDNAME = 1060;
/**
 * The doubt_digest of a statement in doubt sent in a text other than the one in doubt: any of its
 * texts may have taken effect. No digest equals it (it is not hexadecimal); it fills CHAR(64), so it
 * reads back the same whatever the sql_mode says of a CHAR's trailing spaces.
 */
const EITHER_TEXT = 'EITHER TEXT MAY HAVE TAKEN EFFECT'.padEnd(64, '.');

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

export type StatementKind = 'read' | 'session' | 'ddl' | 'dml';

const KINDS: Record<string, StatementKind> = {
  SELECT: 'read',
  SHOW: 'read',
  DESCRIBE: 'read',
  DESC: 'read',
  EXPLAIN: 'read',
  SET: 'session',
  CREATE: 'ddl',
  ALTER: 'ddl',
  DROP: 'ddl',
  RENAME: 'ddl',
  TRUNCATE: 'ddl',
  INSERT: 'dml',
  UPDATE: 'dml',
  DELETE: 'dml',
  REPLACE: 'dml',
};

/** Leading blanks and comments (`-- `, `#`, `/* *\/`): a statement's kind is its first word after them. */
const LEADING = /^(?:\s+|--(?:[ \t\r][^\n]*)?(?:\n|$)|#[^\n]*(?:\n|$)|\/\*(?!!|M!)[\s\S]*?\*\/)*/;

/**
 * What a statement does to the resume: reads and session settings (`SET`) run on every attempt, as
 * their effects steer what follows and last only for the session; DDL and DML are counted. Anything
 * else (a `WITH`, which may lead a read or an UPDATE; a `CALL`; `SET STATEMENT ... FOR`; a statement
 * inside an executable comment, `/*!` or `/*M!`) is refused, so that a statement is
 * never skipped or repeated by a guess.
 */
export function statementKind(sql: string): StatementKind {
  const text = sql.replace(LEADING, '');
  const word = /^[A-Za-z]+/.exec(text)?.[0].toUpperCase() ?? '';
  // MariaDB's `SET STATEMENT ... FOR <statement>` runs that statement: not a session setting.
  const kind = /^SET\s+STATEMENT\b/i.test(text) ? undefined : KINDS[word];
  if (!kind)
    throw new Error(
      `A resumable migration cannot tell whether this statement changes anything (it begins with "${word}"); write it as one beginning with ${Object.keys(KINDS).join(', ')}: ${sql.slice(0, 120)}`,
    );
  return kind;
}

/** A running digest of the counted statements, text and values: resuming checks that the skipped ones are the ones that ran. */
const fold = (digest: string, sql: string, params?: unknown[]) =>
  createHash('sha256')
    .update(digest)
    .update('\0')
    .update(sql)
    .update('\0')
    .update(JSON.stringify(params ?? []))
    .digest('hex');

/**
 * The migration, resumable where it stopped. Its changing statements are counted in
 * migration_progress, the count written after each one: a DML statement and its count in one
 * transaction of their own, so both or neither took effect; a DDL statement commits itself, so a
 * stop can fall between it and its count. Such a DDL is marked in doubt, with its text's digest,
 * before it is sent, and the mark cleared with its count, or when the server refuses it (DDL is
 * atomic on MariaDB 10.6+ and MySQL 8: refused is not applied), unless an earlier run left it in
 * doubt: refusing this run's statement says nothing of whether that run's took effect. Only a
 * statement still in doubt on the next run, the first one not counted, may answer "already applied"
 * (ALREADY_APPLIED), which then counts as done if its text is the one that was in doubt; an edited
 * text so answered is refused, as the answer may be the old text's doing. An edited text is sent
 * marked EITHER_TEXT, the old text's digest put back if the server refuses the edit: if its
 * connection is lost too, no "already applied" counts as done any more (what the texts did is to be
 * undone by hand; the statement then runs). A real error (a column a drifted schema lacks) fails every run alike. The counted ones
 * are skipped, once their digest shows they are the statements that ran: a migration edited before
 * the statement it stopped at (a fix of the failing statement itself is fine) is refused rather
 * than resumed at a position that now means something else. The count is dropped in the
 * transaction that records the migration as run.
 */
export function resumable<M extends MigrationInterface>(Migration: new () => M): new () => M {
  const Resumable = class extends (Migration as new () => MigrationInterface) {
    override async up(q: QueryRunner): Promise<void> {
      const name = this.name ?? Migration.name;
      await q.query(PROGRESS_DDL);
      for (const ddl of ADD_COLUMNS)
        await q.query(ddl).catch((err: unknown) => {
          if (errnoOf(err) !== ER_DUP_FIELDNAME) throw err;
        });
      const [row] = (await q.query('SELECT steps, in_doubt, digest, doubt_digest FROM migration_progress WHERE name = ?', [name])) as {
        steps: number;
        in_doubt: number;
        digest: string | null;
        doubt_digest: string | null;
      }[];
      const done = row ? Number(row.steps) : 0;
      if (!row) await q.query('INSERT INTO migration_progress (name, steps) VALUES (?, 0)', [name]);
      let step = 0;
      let digest = '';
      /** Called once `seen` changing statements have been folded into the digest (all of them, or `done`). */
      const checkSkipped = (seen: number) => {
        if (row?.digest != null && (seen < done || digest !== row.digest))
          throw new Error(
            `Migration ${name} stopped after ${done} of its changing statements, and those are not the first ${done} of its text now: it was edited before the statement it stopped at. ` +
              `Undo or finish those statements by hand to match the new text, then delete its row from migration_progress.`,
          );
      };
      const query = async (sql: string, params?: unknown[]): Promise<unknown> => {
        const kind = statementKind(sql);
        if (kind === 'read' || kind === 'session') return q.query(sql, params);
        const current = step++;
        if (current === done) checkSkipped(current);
        digest = fold(digest, sql, params);
        if (current < done) return [];
        const count = () =>
          q.query('UPDATE migration_progress SET steps = ?, in_doubt = 0, doubt_digest = NULL, digest = ? WHERE name = ?', [
            current + 1,
            digest,
            name,
          ]);
        if (kind === 'dml') {
          // After a DDL statement the session is back in autocommit: the transaction is opened here.
          await q.query('START TRANSACTION');
          const result: unknown = await q.query(sql, params);
          await count();
          await q.query('COMMIT');
          return result;
        }
        const inDoubt = row !== undefined && Number(row.in_doubt) === 1 && current === done;
        // The text an earlier run left in doubt (a row from before doubt_digest: taken as this one), or EITHER_TEXT.
        const doubted = inDoubt ? (row.doubt_digest ?? digest) : digest;
        // Once a text other than the doubted one is sent, either may take effect: no answer is then one text's doing.
        const mark = doubted === digest ? digest : EITHER_TEXT;
        // Outside a DML step the session is in autocommit: the mark is committed before the DDL is sent.
        await q.query('UPDATE migration_progress SET in_doubt = 1, doubt_digest = ? WHERE name = ?', [mark, name]);
        let result: unknown = [];
        try {
          result = await q.query(sql, params);
        } catch (err) {
          const alreadyApplied = inDoubt && ALREADY_APPLIED.has(errnoOf(err) ?? 0);
          // Only the doubted text's own "already applied" is its doing: an edit of it may get the same answer for what the
          // doubted text did (a column's type changed, say).
          if (!(alreadyApplied && doubted === digest)) {
            // A lost connection leaves the mark: this text may have taken effect.
            if (isDatabaseOutage(err)) throw err;
            // Refused by the server, so this text did not take effect: the doubt is put back as it was before this run. A mark
            // this run made is cleared; an earlier run's stays, as that run's statement may have taken effect.
            if (!inDoubt) await q.query('UPDATE migration_progress SET in_doubt = 0, doubt_digest = NULL WHERE name = ?', [name]);
            else if (mark !== row.doubt_digest)
              await q.query('UPDATE migration_progress SET doubt_digest = ? WHERE name = ?', [row.doubt_digest, name]);
            if (!alreadyApplied) throw err;
            const answer = (err as Error).message;
            if (doubted === EITHER_TEXT)
              throw new Error(
                `Migration ${name} lost its connection while sending its statement ${current + 1} in more than one text: any of them may have taken effect, so the server's answer to this one, "${answer}", may be another's doing. ` +
                  `Undo by hand what any of those texts did, and run the migrations again: the text then in the migration runs.`,
                { cause: err },
              );
            throw new Error(
              `Migration ${name} lost its connection while sending its statement ${current + 1}, which has been edited since; the server answers the new text with "${answer}", which may be the old text's doing. ` +
                `Undo by hand what the old statement did, if it did anything, and run the migrations again: the new text then runs.`,
              { cause: err },
            );
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
            if (typeof value !== 'function') return value;
            // createTable, addColumn and the rest send their statements past query(): they would be neither counted nor skipped.
            throw new Error(`A resumable migration sends its statements through query(), not QueryRunner.${String(prop)}()`);
          },
        }),
      );
      if (step <= done) checkSkipped(step);
      // TypeORM then records the migration and commits: both, or neither.
      await q.query('START TRANSACTION');
      await q.query('DELETE FROM migration_progress WHERE name = ?', [name]);
    }
  };
  Object.defineProperty(Resumable, 'name', { value: Migration.name });
  return Resumable as unknown as new () => M;
}
