import mysql from 'mysql2/promise';
import { DataSource } from 'typeorm';
import type { AppConfig } from '../config/app-config.js';
import { dataSourceOptions } from './data-source-options.js';
import { lockName } from './lock-name.js';

export class DatabaseUnreachableError extends Error {}

type DbConfig = Parameters<typeof dataSourceOptions>[0];

/** Creates the database if it is missing. Fails with one readable line when MySQL cannot be reached. */
export async function ensureDatabase(c: DbConfig): Promise<void> {
  let conn: mysql.Connection;
  try {
    conn = await mysql.createConnection({
      host: c.DB_HOST,
      port: c.DB_PORT,
      user: c.DB_USER,
      password: c.DB_PASSWORD,
      connectTimeout: 5000,
    });
  } catch (err) {
    const reason = (err as { code?: string; message?: string }).code ?? (err as Error).message;
    throw new DatabaseUnreachableError(
      `Cannot reach MySQL at ${c.DB_HOST}:${c.DB_PORT} as ${c.DB_USER} (${reason}). Start one with \`docker compose up -d mysql\`, or set DB_HOST/DB_PORT/DB_USER/DB_PASSWORD.`,
    );
  }
  try {
    await conn.query(`CREATE DATABASE IF NOT EXISTS \`${c.DB_NAME}\` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci`);
  } finally {
    await conn.end();
  }
}

/**
 * Applies pending migrations under a named lock, so several instances starting at once migrate
 * exactly once.
 */
export async function migrate(c: DbConfig): Promise<string[]> {
  const ds = new DataSource({ ...dataSourceOptions(c), poolSize: 2 });
  await ds.initialize();
  const runner = ds.createQueryRunner();
  try {
    await runner.connect();
    await runner.query(`SELECT GET_LOCK(?, 60)`, [lockName('migrate', c.DB_NAME)]);
    const done = await ds.runMigrations({ transaction: 'each' });
    await runner.query(`SELECT RELEASE_LOCK(?)`, [lockName('migrate', c.DB_NAME)]);
    return done.map((m) => m.name);
  } finally {
    await runner.release();
    await ds.destroy();
  }
}

export async function prepareDatabase(c: AppConfig): Promise<void> {
  await ensureDatabase(c);
  await migrate(c);
}
