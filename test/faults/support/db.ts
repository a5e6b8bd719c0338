import { randomBytes } from 'node:crypto';
import mysql from 'mysql2/promise';
import { DataSource } from 'typeorm';
import type { AppConfig } from '../../../src/config/app-config.js';
import { dataSourceOptions } from '../../../src/database/data-source-options.js';
import { createTestDatabase, dropTestDatabase, testConfig } from '../../support/harness.js';

export interface AppUser {
  name: string;
  password: string;
}

export interface FaultDatabase {
  name: string;
  config: AppConfig;
  /** Assertions, through a pool of its own. */
  db: DataSource;
  /** Root, connected to no database: fault injection (KILL, SET GLOBAL) that never shows up as a connection to `name`. */
  admin: mysql.Connection;
  /** Set when asked for: a MariaDB account without SUPER for the server, so read_only applies to it and its connections can be told apart. */
  appUser?: AppUser;
  close(): Promise<void>;
}

/** A migrated database of its own for one fault scenario, and optionally a non-privileged account for the server. */
export async function createFaultDatabase(opts: { appUser?: boolean } = {}): Promise<FaultDatabase> {
  const suffix = randomBytes(4).toString('hex');
  const config = testConfig({ DB_NAME: `ce_fault_${process.pid}_${suffix}` });
  await createTestDatabase(config);
  const admin = await mysql.createConnection({
    host: config.DB_HOST,
    port: config.DB_PORT,
    user: config.DB_USER,
    password: config.DB_PASSWORD,
  });
  let appUser: AppUser | undefined;
  if (opts.appUser) {
    appUser = { name: `cef_${suffix}`, password: randomBytes(12).toString('hex') };
    await admin.query(`CREATE USER ?@'%' IDENTIFIED BY ?`, [appUser.name, appUser.password]);
    await admin.query(`GRANT ALL PRIVILEGES ON \`${config.DB_NAME}\`.* TO ?@'%'`, [appUser.name]);
  }
  const db = new DataSource({ ...dataSourceOptions(config), poolSize: 5 });
  await db.initialize();
  return {
    name: config.DB_NAME,
    config,
    db,
    admin,
    appUser,
    async close() {
      await db.destroy();
      if (appUser) await admin.query(`DROP USER IF EXISTS ?@'%'`, [appUser.name]);
      await admin.end();
      await dropTestDatabase(config);
    },
  };
}

/** KILL CONNECTION on every connection `user` has open to `db`. Returns how many were killed. */
export async function killConnections(admin: mysql.Connection, db: string, user: string): Promise<number> {
  const [rows] = await admin.query<mysql.RowDataPacket[]>(`SELECT id FROM information_schema.processlist WHERE db = ? AND user = ?`, [
    db,
    user,
  ]);
  let killed = 0;
  for (const { id } of rows) {
    try {
      await admin.query(`KILL CONNECTION ${Number(id)}`);
      killed++;
    } catch {
      // It ended on its own between the SELECT and the KILL.
    }
  }
  return killed;
}

export async function count(db: DataSource, sql: string, params: unknown[] = []): Promise<number> {
  const [{ n }] = (await db.query(sql, params)) as { n: string }[];
  return Number(n);
}
