import mysql from 'mysql2/promise';
import { DataSource } from 'typeorm';
import { type AppConfig, databaseHosts } from '../config/app-config.js';
import { dataSourceOptions } from './data-source-options.js';
import { acquireLease, ensureLeaseTable } from './lease.js';

export class DatabaseUnreachableError extends Error {}

type DbConfig = Parameters<typeof dataSourceOptions>[0];

/**
 * Creates the database if it is missing, on the first of the hosts that answers (DB_HOSTS: a
 * Galera cluster replicates it to the others). Fails with one readable line when none can be reached.
 */
export async function ensureDatabase(c: DbConfig): Promise<void> {
  let conn: mysql.Connection | undefined;
  const failures: string[] = [];
  for (const { host, port } of databaseHosts(c)) {
    try {
      conn = await mysql.createConnection({ host, port, user: c.DB_USER, password: c.DB_PASSWORD, connectTimeout: 5000 });
      break;
    } catch (err) {
      failures.push(`${host}:${port} (${(err as { code?: string; message?: string }).code ?? (err as Error).message})`);
    }
  }
  if (!conn) {
    throw new DatabaseUnreachableError(
      `Cannot reach MySQL at ${failures.join(', ')} as ${c.DB_USER}. Start one with \`docker compose up -d mysql\`, or set DB_HOST/DB_PORT (or DB_HOSTS)/DB_USER/DB_PASSWORD.`,
    );
  }
  try {
    await conn.query(`CREATE DATABASE IF NOT EXISTS \`${c.DB_NAME}\` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci`);
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
export async function migrate(c: DbConfig & Pick<AppConfig, 'LEASE_TTL_MS' | 'DB_TX_RETRIES'>): Promise<string[]> {
  const ds = new DataSource({ ...dataSourceOptions(c), poolSize: 2 });
  await ds.initialize();
  try {
    await ensureLeaseTable(ds);
    const lease = await acquireLease(ds, 'migrate', { ttlMs: c.LEASE_TTL_MS, retries: c.DB_TX_RETRIES }, MIGRATE_WAIT_MS);
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

export async function prepareDatabase(c: AppConfig): Promise<void> {
  await ensureDatabase(c);
  await migrate(c);
}
