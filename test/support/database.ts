import mysql from 'mysql2/promise';
import type { AppConfig } from '../../src/config/app-config.js';

// Free of jest, so the benchmark shares these with the tests.

/** The variables of `names` that are set in the environment. */
export function pickEnv(...names: string[]): Record<string, string> {
  return Object.fromEntries(names.filter((n) => process.env[n] !== undefined).map((n) => [n, process.env[n] as string]));
}

export async function dropTestDatabase(config: AppConfig): Promise<void> {
  const conn = await mysql.createConnection({
    host: config.DB_HOST,
    port: config.DB_PORT,
    user: config.DB_USER,
    password: config.DB_PASSWORD,
  });
  try {
    await conn.query(`DROP DATABASE IF EXISTS \`${config.DB_NAME}\``);
  } finally {
    await conn.end();
  }
}
