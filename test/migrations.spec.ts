import { setTimeout as sleep } from 'node:timers/promises';
import { DataSource, MigrationInterface, QueryRunner } from 'typeorm';
import { ensureDatabase } from '../src/database/bootstrap-database.js';
import { isDatabaseOutage } from '../src/common/db-errors.js';
import { resumable } from '../src/database/resumable-migration.js';
import { dataSourceOptions } from '../src/database/data-source-options.js';
import { migrations } from '../src/database/migrations/index.js';
import { ExactOrderNumbers1764979200000 } from '../src/database/migrations/1764979200000-exact-order-numbers.js';
import { RunTotals1765929600000 } from '../src/database/migrations/1765929600000-run-totals.js';
import { ORDER_LOCK_STRIPES } from '../src/redemption/order.js';
import { createTestDatabase, dropTestDatabase, testConfig } from './support/harness.js';

describe('migrations', () => {
  const config = testConfig();
  let ds: DataSource;
  beforeAll(async () => {
    await createTestDatabase(config);
    ds = new DataSource({ ...dataSourceOptions(config), poolSize: 2 });
    await ds.initialize();
  });
  afterAll(async () => {
    await ds.destroy();
    await dropTestDatabase(config);
  });

  const tables = async () =>
    (
      (await ds.query(
        `SELECT table_name AS t FROM information_schema.tables WHERE table_schema = ? AND table_name NOT IN ('migrations', 'migration_progress', 'job_lease') ORDER BY 1`,
        [config.DB_NAME],
      )) as { t: string }[]
    ).map((r) => r.t);

  it('builds every table as InnoDB utf8mb4 with millisecond timestamps', async () => {
    expect(await tables()).toEqual([
      'admin_request',
      'compensation',
      'coupon',
      'coupon_order',
      'coupon_order_lock',
      'coupon_stock',
      'discrepancy',
      'issuance_job',
      'issuance_job_line',
      'issuance_job_skip',
      'reconciliation_run',
      'redemption',
      'redemption_hold',
      'refund',
      'refund_number',
      'tx_marker',
      'user_coupon',
      'user_coupon_state_log',
      'webhook_delivery',
      'webhook_delivery_attempt',
      'webhook_endpoint',
      'webhook_relay_cursor',
    ]);
    const engines = (await ds.query(`SELECT DISTINCT engine, table_collation FROM information_schema.tables WHERE table_schema = ?`, [
      config.DB_NAME,
    ])) as { engine: string; table_collation: string }[];
    expect(engines.every((e) => e.engine === 'InnoDB' && e.table_collation.startsWith('utf8mb4'))).toBe(true);
    const datetimes = (await ds.query(
      `SELECT DISTINCT datetime_precision AS p FROM information_schema.columns WHERE table_schema = ? AND data_type = 'datetime'`,
      [config.DB_NAME],
    )) as { p: number }[];
    expect(datetimes.map((d) => Number(d.p))).toEqual([3]);
    // Every stripe the order lock can pick is a row (an order on a missing one would lock nothing).
    const [{ n, top }] = (await ds.query(`SELECT COUNT(*) AS n, MAX(stripe) AS top FROM coupon_order_lock`)) as {
      n: string;
      top: number;
    }[];
    expect([Number(n), Number(top)]).toEqual([ORDER_LOCK_STRIPES, ORDER_LOCK_STRIPES - 1]);
  });

  it('goes down to nothing and up again cleanly', async () => {
    for (let i = 0; i < migrations.length; i++) await ds.undoLastMigration({ transaction: 'each' });
    expect(await tables()).toEqual([]);
    const applied = await ds.runMigrations({ transaction: 'each' });
    expect(applied.map((m) => m.name)).toEqual(migrations.map((m) => new m().name));
    expect(await tables()).toHaveLength(22);
    expect(await ds.showMigrations()).toBe(false);
  });
  /** Undoes the migrations that came after `name` (the class name), leaving `name` the last one applied. */
  async function undoAfter(name: string): Promise<void> {
    const index = migrations.findIndex((m) => m.name === name);
    expect(index).toBeGreaterThanOrEqual(0);
    for (let i = migrations.length - 1; i > index; i--) await ds.undoLastMigration({ transaction: 'each' });
  }

  it('gives orders that differ only in trailing spaces a row each, and refuses to go back while such numbers are stored', async () => {
    await undoAfter(ExactOrderNumbers1764979200000.name);
    await ds.undoLastMigration({ transaction: 'each' });
    const now = new Date();
    // Under the PAD SPACE collation `M-1 ` was order M-1: one row, marked refunded by the refund of `M-1 `.
    await ds.query(`INSERT INTO coupon_order (order_no, order_amount_cents, refunded, created_at) VALUES ('M-1', 500, 1, ?)`, [now]);
    await ds.query(
      `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at)
       VALUES (1, 'M-1', 'u', 500, 100, 'USED', ?), (2, 'M-1 ', 'u', 700, 100, 'USED', ?)`,
      [now, now],
    );
    await ds.query(`INSERT INTO refund (refund_no, redemption_id, user_coupon_id, order_no, created_at) VALUES ('R-1', 2, 2, 'M-1 ', ?)`, [
      now,
    ]);
    try {
      await ds.runMigrations({ transaction: 'each' });
      const orders = (await ds.query(
        `SELECT order_no AS o, order_amount_cents AS a, refunded AS r FROM coupon_order ORDER BY order_no`,
      )) as {
        o: string;
        a: string;
        r: number;
      }[];
      expect(orders.map((o) => [o.o, Number(o.a), Number(o.r)])).toEqual([
        ['M-1', 500, 0],
        ['M-1 ', 700, 1],
      ]);
      // The refunds made before RefundNumbers1765497600000 have their numbers taken.
      const numbers = (await ds.query(`SELECT n.refund_no AS n FROM refund_number n JOIN refund r ON r.id = n.refund_id`)) as {
        n: string;
      }[];
      expect(numbers.map((r) => r.n)).toEqual(['R-1']);
      await undoAfter(ExactOrderNumbers1764979200000.name);
      await expect(ds.undoLastMigration({ transaction: 'each' })).rejects.toThrow(/coupon_order holds order_no values/);
      await ds.runMigrations({ transaction: 'each' });
      expect(await ds.showMigrations()).toBe(false);
    } finally {
      for (const table of ['refund_number', 'refund', 'redemption', 'coupon_order']) await ds.query(`DELETE FROM ${table}`);
    }
  });

  it("gives an open finding of a refund's lost redemption its own key, and back", async () => {
    await undoAfter(RunTotals1765929600000.name);
    const record = (type: string, key: string) =>
      ds.query(`INSERT INTO discrepancy (run_id, type, details, open_key, created_at) VALUES (1, ?, '{}', ?, NOW(3))`, [type, key]);
    const keys = async () =>
      (
        (await ds.query(`SELECT type, open_key AS k FROM discrepancy ORDER BY id`)) as {
          type: string;
          k: string | null;
        }[]
      ).map((r) => `${r.type} ${r.k}`);
    try {
      await record('REFUND_REDEMPTION_MISSING', 'refund:8');
      await record('REFUND_REPLACEMENT_MISSING', 'refund:9');
      await ds.runMigrations({ transaction: 'each' });
      // The refund of the first can now have its other finding open beside it.
      await record('REFUND_REPLACEMENT_MISSING', 'refund:8');
      expect(await keys()).toEqual([
        'REFUND_REDEMPTION_MISSING refund-redemption:8',
        'REFUND_REPLACEMENT_MISSING refund:9',
        'REFUND_REPLACEMENT_MISSING refund:8',
      ]);
      // Back past it, refund 8 would have two findings open under one key: refused until one is decided.
      await expect(undoAfter(RunTotals1765929600000.name)).rejects.toThrow(/refund-redemption:8.*approve or reject one/);
      await ds.query(`UPDATE discrepancy SET open_key = NULL WHERE open_key = 'refund:8'`);
      await undoAfter(RunTotals1765929600000.name);
      expect(await keys()).toEqual([
        'REFUND_REDEMPTION_MISSING refund:8',
        'REFUND_REPLACEMENT_MISSING refund:9',
        'REFUND_REPLACEMENT_MISSING null',
      ]);
      await ds.runMigrations({ transaction: 'each' });
      expect(await ds.showMigrations()).toBe(false);
    } finally {
      await ds.query(`DELETE FROM discrepancy`);
    }
  });
});

describe('migrations stopped halfway (MySQL and MariaDB commit each DDL statement on its own)', () => {
  const reference = testConfig();
  let admin: DataSource;
  beforeAll(async () => {
    await createTestDatabase(reference);
    admin = new DataSource({ ...dataSourceOptions(reference), poolSize: 2 });
    await admin.initialize();
  });
  afterAll(async () => {
    await admin.destroy();
    await dropTestDatabase(reference);
  });

  /** Every table's definition (its AUTO_INCREMENT counter aside), and the migrations recorded. */
  const schemaOf = async (db: string) => {
    const names = (await admin.query(
      `SELECT table_name AS t FROM information_schema.tables WHERE table_schema = ? AND table_name <> 'job_lease' ORDER BY 1`,
      [db],
    )) as {
      t: string;
    }[];
    const tables: Record<string, string> = {};
    for (const { t } of names) {
      const [row] = (await admin.query(`SHOW CREATE TABLE \`${db}\`.\`${t}\``)) as Record<string, string>[];
      tables[t] = row['Create Table'].replace(/ AUTO_INCREMENT=\d+/, '');
    }
    const ran = ((await admin.query(`SELECT name FROM \`${db}\`.migrations ORDER BY id`)) as { name: string }[]).map((r) => r.name);
    return { tables, ran };
  };

  it('a statement the server refuses fails every run alike: only one cut off by a lost connection may turn out applied', async () => {
    class Drifted1799999999999 implements MigrationInterface {
      name = 'Drifted1799999999999';
      async up(q: QueryRunner): Promise<void> {
        await q.query('CREATE TABLE drifted (id INT PRIMARY KEY)');
        // A column this schema lacks (1054, one of the answers a re-sent DDL may give).
        await q.query('ALTER TABLE drifted ADD COLUMN b INT AFTER missing');
      }
      async down(): Promise<void> {}
    }
    const config = testConfig();
    await ensureDatabase(config);
    const ds = new DataSource({ ...dataSourceOptions(config), migrations: [resumable(Drifted1799999999999)], poolSize: 1 });
    await ds.initialize();
    try {
      await expect(ds.runMigrations({ transaction: 'each' })).rejects.toThrow(/Unknown column 'missing'/);
      await expect(ds.runMigrations({ transaction: 'each' })).rejects.toThrow(/Unknown column 'missing'/);
      expect(await ds.showMigrations()).toBe(true);
    } finally {
      await ds.destroy();
      await dropTestDatabase(config);
    }
  });

  /** One run of these migrations on a connection of its own (a new session: its variables start unset). */
  async function runOn(config: ReturnType<typeof testConfig>, ...list: (new () => MigrationInterface)[]): Promise<string[]> {
    const ds = new DataSource({ ...dataSourceOptions(config), migrations: list.map((m) => resumable(m)), poolSize: 1 });
    await ds.initialize();
    try {
      return (await ds.runMigrations({ transaction: 'each' })).map((m) => m.name);
    } finally {
      await ds.destroy();
    }
  }

  /** A migration named `name` sending `statements` in turn. */
  const migrationOf = (name: string, statements: string[]) =>
    class implements MigrationInterface {
      name = name;
      async up(q: QueryRunner): Promise<void> {
        for (const sql of statements) await q.query(sql);
      }
      async down(): Promise<void> {}
    };

  it('resumes a migration whose failing statement was fixed, and refuses one edited before the statement it stopped at', async () => {
    const config = testConfig();
    await ensureDatabase(config);
    const name = 'Edited1799999999998';
    const create = 'CREATE TABLE edited (id INT PRIMARY KEY)';
    const insert = 'INSERT INTO edited (id) VALUES (1)';
    try {
      await expect(runOn(config, migrationOf(name, [create, insert, 'ALTER TABLE edited ADD COLUMN b INT AFTER missing']))).rejects.toThrow(
        /Unknown column 'missing'/,
      );
      const refused =
        /Migration Edited1799999999998 stopped after 2 of its changing statements, and those are not the first 2 of its text now/;
      for (const edited of [
        [create.replace('INT', 'BIGINT'), insert, 'ALTER TABLE edited ADD COLUMN b INT'],
        [create, 'INSERT INTO edited (id) VALUES (2)', 'ALTER TABLE edited ADD COLUMN b INT'],
        [create],
      ])
        await expect(runOn(config, migrationOf(name, edited))).rejects.toThrow(refused);
      expect(await runOn(config, migrationOf(name, [create, insert, 'ALTER TABLE edited ADD COLUMN b INT']))).toEqual([name]);
      const rows = (await admin.query(`SELECT * FROM \`${config.DB_NAME}\`.edited`)) as Record<string, unknown>[];
      expect(rows).toEqual([{ id: 1, b: null }]);
    } finally {
      await dropTestDatabase(config);
    }
  });

  it('clears the digest of the text in doubt whenever it clears the doubt: when counting the statement, and when the server refuses one this run marked', async () => {
    const config = testConfig();
    await ensureDatabase(config);
    const db = `\`${config.DB_NAME}\``;
    const name = 'Cleared1799999999992';
    const create = 'CREATE TABLE cleared (id INT PRIMARY KEY)';
    const progress = () => admin.query(`SELECT steps, in_doubt, doubt_digest FROM ${db}.migration_progress WHERE name = ?`, [name]);
    try {
      // The CREATE is counted; the INSERT then fails on its duplicate key, leaving the row as the count wrote it.
      await expect(runOn(config, migrationOf(name, [create, 'INSERT INTO cleared (id) VALUES (1), (1)']))).rejects.toThrow(
        /Duplicate entry/,
      );
      expect(await progress()).toEqual([{ steps: 1, in_doubt: 0, doubt_digest: null }]);
      await expect(runOn(config, migrationOf(name, [create, 'ALTER TABLE cleared ADD COLUMN b INT AFTER missing']))).rejects.toThrow(
        /Unknown column 'missing'/,
      );
      expect(await progress()).toEqual([{ steps: 1, in_doubt: 0, doubt_digest: null }]);
    } finally {
      await dropTestDatabase(config);
    }
  });

  /** The session of a migration while it runs `statement` (in the given state, if one is given). */
  async function migrating(sessions: DataSource, db: string, statement: string, state?: string): Promise<number> {
    for (;;) {
      const [session] = (await sessions.query(
        `SELECT id FROM information_schema.processlist WHERE db = ? AND info LIKE ? AND (? IS NULL OR state = ?)`,
        [db, `${statement}%`, state ?? null, state ?? null],
      )) as { id: string }[];
      if (session) return Number(session.id);
      await sleep(5);
    }
  }

  /**
   * One run of migration `name`, whose one statement is `statement` on `table`, that loses its connection (KILL) while the
   * statement is marked in doubt: once the statement took effect, before its count (`applied`), or before it took effect.
   */
  async function cutOff(
    config: ReturnType<typeof testConfig>,
    sessions: DataSource,
    { name, statement, table, applied }: { name: string; statement: string; table: string; applied: boolean },
  ): Promise<void> {
    const [readerOfTable, lockerOfProgress] = [sessions.createQueryRunner(), sessions.createQueryRunner()];
    try {
      // The statement waits for the table behind a reader, so it can be killed there, or the progress row locked
      // in the meantime: the statement then takes effect and its count waits.
      await readerOfTable.startTransaction();
      await readerOfTable.query(`SELECT * FROM ${table}`);
      const run = runOn(config, migrationOf(name, [statement]));
      void run.catch(() => undefined);
      const waiting = await migrating(sessions, config.DB_NAME, statement, 'Waiting for table metadata lock');
      if (applied) {
        await lockerOfProgress.startTransaction();
        await lockerOfProgress.query('SELECT * FROM migration_progress WHERE name = ? FOR UPDATE', [name]);
        await readerOfTable.commitTransaction();
        await sessions.query(`KILL ${await migrating(sessions, config.DB_NAME, 'UPDATE migration_progress SET steps')}`);
      } else await sessions.query(`KILL ${waiting}`);
      await expect(run).rejects.toThrow();
    } finally {
      if (readerOfTable.isTransactionActive) await readerOfTable.rollbackTransaction();
      if (lockerOfProgress.isTransactionActive) await lockerOfProgress.rollbackTransaction();
      await readerOfTable.release();
      await lockerOfProgress.release();
    }
    expect(await sessions.query('SELECT steps, in_doubt FROM migration_progress WHERE name = ?', [name])).toEqual([
      { steps: 0, in_doubt: 1 },
    ]);
  }

  const columnType = async (config: ReturnType<typeof testConfig>, table: string, column: string) =>
    (
      (await admin.query(
        `SELECT column_type AS t FROM information_schema.columns WHERE table_schema = ? AND table_name = ? AND column_name = ?`,
        [config.DB_NAME, table, column],
      )) as { t: string }[]
    ).map((r) => r.t);

  it('takes "already applied" for a statement left in doubt only if its text is the one that was in doubt', async () => {
    const config = testConfig();
    await ensureDatabase(config);
    const db = `\`${config.DB_NAME}\``;
    const name = 'Doubtful1799999999993';
    const alter = 'ALTER TABLE doubtful ADD COLUMN b INT';
    const sessions = new DataSource({ ...dataSourceOptions(config), poolSize: 3 });
    await sessions.initialize();
    try {
      await sessions.query('CREATE TABLE doubtful (id INT PRIMARY KEY)');
      await cutOff(config, sessions, { name, statement: alter, table: 'doubtful', applied: true });

      await expect(runOn(config, migrationOf(name, ['ALTER TABLE doubtful ADD COLUMN b BIGINT']))).rejects.toThrow(
        /Migration Doubtful1799999999993 lost its connection while sending its statement 1, which has been edited since; the server answers the new text with "Duplicate column name 'b'"/,
      );
      expect(await runOn(config, migrationOf(name, [alter]))).toEqual([name]);
      expect(await columnType(config, 'doubtful', 'b')).toEqual(['int(11)']);
      expect(await sessions.query(`SELECT name FROM ${db}.migrations`)).toEqual([{ name }]);
    } finally {
      await sessions.destroy();
      await dropTestDatabase(config);
    }
  });

  it('keeps the doubt an earlier run left when the server refuses this run its statement: the refusal says nothing of whether the earlier one took effect', async () => {
    const config = testConfig();
    await ensureDatabase(config);
    const name = 'Kept1799999999991';
    const alter = 'ALTER TABLE kept ADD COLUMN b INT';
    const sessions = new DataSource({ ...dataSourceOptions(config), poolSize: 3 });
    await sessions.initialize();
    const lockerOfTable = sessions.createQueryRunner();
    try {
      await sessions.query('CREATE TABLE kept (id INT PRIMARY KEY)');
      await cutOff(config, sessions, { name, statement: alter, table: 'kept', applied: true });
      // Refusals for a reason of the moment: the table locked by another session past the statement's time limit.
      await lockerOfTable.query('LOCK TABLES kept WRITE');
      for (const text of [alter, 'ALTER TABLE kept ADD COLUMN b BIGINT']) {
        const refusal = await runOn(config, migrationOf(name, ['SET max_statement_time = 1', text])).then(
          () => undefined,
          (err: unknown) => err,
        );
        expect(refusal).toMatchObject({ message: expect.stringMatching(/max_statement_time exceeded/) as unknown });
        // A refusal by the server, not a lost connection (which leaves any mark as it is).
        expect(isDatabaseOutage(refusal)).toBe(false);
      }
      await lockerOfTable.query('UNLOCK TABLES');
      expect(await runOn(config, migrationOf(name, [alter]))).toEqual([name]);
      expect(await columnType(config, 'kept', 'b')).toEqual(['int(11)']);
    } finally {
      await lockerOfTable.query('UNLOCK TABLES');
      await lockerOfTable.release();
      await sessions.destroy();
      await dropTestDatabase(config);
    }
  });

  it('sends an edit of a statement in doubt as "either text may have taken effect": once it is cut off too, no "already applied" counts as done', async () => {
    const config = testConfig();
    await ensureDatabase(config);
    const name = 'Either1799999999990';
    const [int, bigint] = ['ALTER TABLE edits ADD COLUMN b INT', 'ALTER TABLE edits ADD COLUMN b BIGINT'];
    const sessions = new DataSource({ ...dataSourceOptions(config), poolSize: 3 });
    await sessions.initialize();
    try {
      await sessions.query('CREATE TABLE edits (id INT PRIMARY KEY)');
      await cutOff(config, sessions, { name, statement: int, table: 'edits', applied: false });
      expect(await columnType(config, 'edits', 'b')).toEqual([]);
      await cutOff(config, sessions, { name, statement: bigint, table: 'edits', applied: true });
      expect(await columnType(config, 'edits', 'b')).toEqual(['bigint(20)']);
      // "Duplicate column" is the edit's doing here, but the same answer would come if the first text had taken effect.
      for (const text of [int, bigint])
        await expect(runOn(config, migrationOf(name, [text]))).rejects.toThrow(
          /Migration Either1799999999990 lost its connection while sending its statement 1 in more than one text: any of them may have taken effect, so the server's answer to this one, "Duplicate column name 'b'", may be another's doing/,
        );
      // What the message asks for: the column undone by hand, the text in the migration then runs.
      await sessions.query('ALTER TABLE edits DROP COLUMN b');
      expect(await runOn(config, migrationOf(name, [int]))).toEqual([name]);
      expect(await columnType(config, 'edits', 'b')).toEqual(['int(11)']);
    } finally {
      await sessions.destroy();
      await dropTestDatabase(config);
    }
  });

  it('resumes by position a migration stopped under the first version of the progress table, which kept no digest', async () => {
    const config = testConfig();
    await ensureDatabase(config);
    const db = `\`${config.DB_NAME}\``;
    try {
      await admin.query(
        `CREATE TABLE ${db}.migration_progress (name VARCHAR(255) NOT NULL PRIMARY KEY, steps INT UNSIGNED NOT NULL, in_doubt TINYINT(1) NOT NULL DEFAULT 0)`,
      );
      await admin.query(`CREATE TABLE ${db}.legacy (id INT PRIMARY KEY)`);
      await admin.query(`INSERT INTO ${db}.migration_progress (name, steps) VALUES ('Legacy1799999999994', 1)`);
      const name = 'Legacy1799999999994';
      expect(
        await runOn(config, migrationOf(name, ['CREATE TABLE legacy (id INT PRIMARY KEY)', 'INSERT INTO legacy (id) VALUES (1)'])),
      ).toEqual([name]);
      expect(await admin.query(`SELECT id FROM ${db}.legacy`)).toEqual([{ id: 1 }]);
    } finally {
      await dropTestDatabase(config);
    }
  });

  it('runs session settings again on resuming, and counts a statement led by a comment by its first word', async () => {
    const config = testConfig();
    await ensureDatabase(config);
    const name = 'Session1799999999997';
    const head = ['SET @v = 7', '/* why */ CREATE TABLE session_v (v INT)', '-- why\nINSERT INTO session_v (v) VALUES (@v)'];
    try {
      await expect(runOn(config, migrationOf(name, [...head, 'ALTER TABLE session_v ADD COLUMN b INT AFTER missing']))).rejects.toThrow(
        /Unknown column 'missing'/,
      );
      // A new session: @v is set again, and neither the CREATE nor the INSERT is.
      await runOn(
        config,
        migrationOf(name, [...head, 'ALTER TABLE session_v ADD COLUMN b INT', 'INSERT INTO session_v (v) VALUES (@v + 1)']),
      );
      const rows = (await admin.query(`SELECT v FROM \`${config.DB_NAME}\`.session_v ORDER BY v`)) as { v: number }[];
      expect(rows.map((r) => r.v)).toEqual([7, 8]);
    } finally {
      await dropTestDatabase(config);
    }
  });

  it("refuses a statement it cannot classify, and QueryRunner's own schema methods, whose statements it would not count", async () => {
    const config = testConfig();
    await ensureDatabase(config);
    class Helpers1799999999996 implements MigrationInterface {
      name = 'Helpers1799999999996';
      async up(q: QueryRunner): Promise<void> {
        await q.dropTable('nothing', true);
      }
      async down(): Promise<void> {}
    }
    try {
      await expect(runOn(config, migrationOf('With1799999999995', ['WITH x AS (SELECT 1) SELECT * FROM x']))).rejects.toThrow(
        /cannot tell whether this statement changes anything \(it begins with "WITH"\)/,
      );
      await expect(runOn(config, Helpers1799999999996)).rejects.toThrow(/through query\(\), not QueryRunner\.dropTable\(\)/);
    } finally {
      await dropTestDatabase(config);
    }
  });

  it.each([2, 9, 15])(
    'a run whose connection is killed once %i tables exist is finished by the next run, to the same schema',
    async (tablesAtKill) => {
      const config = testConfig();
      await ensureDatabase(config);
      const first = new DataSource({ ...dataSourceOptions(config), poolSize: 1 });
      await first.initialize();
      try {
        const run = first.runMigrations({ transaction: 'each' });
        let stopped = false;
        void run.catch(() => undefined).finally(() => (stopped = true));
        // What a crash or a lost connection does to the migrating session: the DDL it ran stays, the rest is rolled back.
        for (;;) {
          const [{ n }] = (await admin.query(`SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = ?`, [
            config.DB_NAME,
          ])) as { n: string }[];
          if (Number(n) >= tablesAtKill || stopped) break;
          await sleep(1);
        }
        const sessions = (await admin.query(`SELECT id FROM information_schema.processlist WHERE db = ?`, [config.DB_NAME])) as {
          id: string;
        }[];
        for (const { id } of sessions) await admin.query(`KILL ${Number(id)}`).catch(() => undefined);
        await expect(run).rejects.toThrow();
      } finally {
        await first.destroy().catch(() => undefined);
      }
      const halfway = await schemaOf(config.DB_NAME);
      expect(halfway.ran.length).toBeLessThan(migrations.length);

      const second = new DataSource({ ...dataSourceOptions(config), poolSize: 1 });
      await second.initialize();
      try {
        await second.runMigrations({ transaction: 'each' });
        expect(await second.showMigrations()).toBe(false);
      } finally {
        await second.destroy();
      }
      expect(await schemaOf(config.DB_NAME)).toEqual(await schemaOf(reference.DB_NAME));
      await dropTestDatabase(config);
    },
    60_000,
  );
});
