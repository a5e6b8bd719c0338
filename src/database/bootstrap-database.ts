import mysql from 'mysql2/promise';
import { DataSource } from 'typeorm';
import { isDatabaseOutage } from '../common/db-errors.js';
import { type AppConfig, databaseHosts } from '../config/app-config.js';
import { dataSourceOptions } from './data-source-options.js';
import { acquireLease, ensureLeaseTable } from './lease.js';

export class DatabaseUnreachableError extends Error {}

type DbConfig = Parameters<typeof dataSourceOptions>[0];

const ER_DBACCESS_DENIED = 1044;
/** Wrong password or unknown user (1045); MariaDB answers 1698 for an account it may not log in with a password. */
const ACCESS_DENIED = new Set([1045, 1698]);

type DriverError = { code?: string; errno?: number; message?: string };

/**
 * Creates the database if it is missing, on the first of the hosts that answers (DB_HOSTS: a
 * Galera cluster replicates it to the others). Fails with one readable line saying what went wrong
 * and what to check: access denied is not "cannot reach".
 */
export async function ensureDatabase(c: DbConfig): Promise<void> {
  let conn: mysql.Connection | undefined;
  let at = '';
  const failures: string[] = [];
  for (const { host, port } of databaseHosts(c)) {
    at = `MySQL at ${host}:${port}`;
    try {
      conn = await mysql.createConnection({ host, port, user: c.DB_USER, password: c.DB_PASSWORD, connectTimeout: 5000 });
      break;
    } catch (err) {
      const e = err as DriverError;
      if (e.errno !== undefined && ACCESS_DENIED.has(e.errno)) {
        throw new DatabaseUnreachableError(
          `${at} denied access to user '${c.DB_USER}' (${e.message}). Check DB_USER and DB_PASSWORD, and that this user may connect from this host.`,
        );
      }
      failures.push(`${host}:${port} (${e.code ?? e.message})`);
    }
  }
  if (!conn) {
    throw new DatabaseUnreachableError(
      `Cannot reach MySQL at ${failures.join(', ')} as ${c.DB_USER}. Start one with \`docker compose up -d mysql\`, or set DB_HOST/DB_PORT (or DB_HOSTS)/DB_USER/DB_PASSWORD.`,
    );
  }
  try {
    // Looked up first so that an account allowed only into an existing database needs no CREATE privilege.
    const [found] = await conn.query<mysql.RowDataPacket[]>(`SELECT 1 FROM information_schema.schemata WHERE schema_name = ?`, [c.DB_NAME]);
    if (found.length === 0)
      await conn.query(`CREATE DATABASE IF NOT EXISTS \`${c.DB_NAME}\` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci`);
  } catch (err) {
    const e = err as DriverError;
    if (e.errno !== ER_DBACCESS_DENIED) throw err;
    throw new DatabaseUnreachableError(
      `User '${c.DB_USER}' may not create or use database ${c.DB_NAME} on ${at} (${e.message}). Create it and grant the user ALL on it, or set DB_NAME.`,
    );
  } finally {
    await conn.end();
  }
}

/** How long a starting instance waits for another one's migrations before giving up. */
const MIGRATE_WAIT_MS = 120_000;

/**
 * Applies pending migrations under the `migrate` lease, so several instances starting at once
 * (on one server or on several Galera nodes) migrate exactly once; the others wait, then find
 * nothing pending. The lease table has to exist before the first migration, so it is created here
 * (CREATE TABLE IF NOT EXISTS: instances racing on it all succeed; on Galera the DDL is totally
 * ordered across nodes, so the later ones are no-ops).
 */
export async function migrate(
  c: DbConfig & Pick<AppConfig, 'LEASE_TTL_MS' | 'DB_TX_RETRIES'>,
  tell: (line: string) => void = () => undefined,
): Promise<string[]> {
  const ds = new DataSource({ ...dataSourceOptions(c), poolSize: 2 });
  await ds.initialize();
  try {
    await ensureLeaseTable(ds);
    // Said once: a start that died migrating leaves its lease to expire (LEASE_TTL_MS), and the next start sat silent until then.
    const lease = await acquireLease(ds, 'migrate', { ttlMs: c.LEASE_TTL_MS, retries: c.DB_TX_RETRIES }, MIGRATE_WAIT_MS, (holder, until) =>
      tell(
        `Waiting for the migrations of ${holder ?? 'another instance'} (its lease runs until ${until.toISOString()} unless renewed; a start that died holding it lets go then)`,
      ),
    );
    try {
      const done = await ds.runMigrations({ transaction: 'each' });
      return done.map((m) => m.name);
    } finally {
      await lease.release();
    }
  } finally {
    await ds.destroy();
  }
}

/**
 * For a start's steps after ensureDatabase reached the server (migrating, opening the pool): a
 * database lost meanwhile is one line like ensureDatabase's, not a driver stack trace.
 */
export function lostWhileStarting(c: DbConfig): (err: unknown) => never {
  return (err) => {
    if (!isDatabaseOutage(err)) throw err;
    const e = err as DriverError;
    const hosts = databaseHosts(c)
      .map((h) => `${h.host}:${h.port}`)
      .join(', ');
    // The pool is opened whole at start: a server at max_connections is a setting to change, not an outage to wait out.
    if (e.code === 'ER_CON_COUNT_ERROR') {
      throw new DatabaseUnreachableError(
        `MySQL at ${hosts} refused more connections while starting (${e.code}: ${e.message}). This instance opens DB_POOL_SIZE (${c.DB_POOL_SIZE}) + 1; ` +
          `lower DB_POOL_SIZE or raise the server's max_connections to at least instances x (DB_POOL_SIZE + 1), with room for a restart's overlap.`,
      );
    }
    throw new DatabaseUnreachableError(
      `Lost MySQL at ${hosts} while starting (${e.code ?? e.errno}: ${e.message}). Nothing is left half-done: migrations resume where they stopped. Start again once it answers.`,
    );
  };
}

/** Creates the database if missing and migrates it; returns the names of the migrations applied now. */
export async function prepareDatabase(c: AppConfig, tell?: (line: string) => void): Promise<string[]> {
  await ensureDatabase(c);
  return migrate(c, tell);
}
