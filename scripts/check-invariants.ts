// Checks every invariant of API.md on a database, directly in SQL: npm run check:invariants -- [--db <name>]
// Connection settings come from the environment like the service's (DB_HOST, DB_PORT, DB_USER, DB_PASSWORD, DB_NAME).
// Exit status: 0 consistent, 1 violations found (one per line on stdout), 2 usage or connection error.
import { parseArgs } from 'node:util';
import { DataSource } from 'typeorm';
import { ConfigError, loadConfig, readEnvFile } from '../src/config/app-config.js';
import { dataSourceOptions } from '../src/database/data-source-options.js';
import { checkInvariants } from '../src/ledger/invariants.js';

async function main(): Promise<number> {
  const { values } = parseArgs({ options: { db: { type: 'string' }, help: { type: 'boolean', short: 'h' } } });
  if (values.help) {
    console.log('usage: npm run check:invariants -- [--db <database name>]   (default: DB_NAME, else "coupon")');
    return 0;
  }
  readEnvFile();
  const config = loadConfig({ ...process.env, ...(values.db !== undefined ? { DB_NAME: values.db } : {}) });
  const db = new DataSource({ ...dataSourceOptions(config), poolSize: 2 });
  await db.initialize();
  try {
    const [{ n }] = (await db.query(
      `SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = ? AND table_name = 'coupon_stock'`,
      [config.DB_NAME],
    )) as { n: string }[];
    if (Number(n) === 0) {
      console.error(`check-invariants: database ${config.DB_NAME} has no coupon-engine schema`);
      return 2;
    }
    const violations = await checkInvariants(db);
    for (const v of violations) console.log(v);
    console.error(`check-invariants: ${config.DB_NAME}: ${violations.length} violation(s)`);
    return violations.length === 0 ? 0 : 1;
  } finally {
    await db.destroy();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(`check-invariants: ${err instanceof ConfigError ? err.message : err instanceof Error ? err.message : String(err)}`);
    process.exit(2);
  },
);
