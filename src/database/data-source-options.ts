import type { MysqlDataSourceOptions } from 'typeorm/driver/mysql/MysqlDataSourceOptions.js';
import { type AppConfig, databaseHosts } from '../config/app-config.js';
import { formatQuery, SESSION_TIME_ZONE } from './sql-rows.js';
import { failoverDriver } from './failover-pool.js';
import { migrations } from './migrations/index.js';

type DbConfig = Pick<AppConfig, 'DB_HOSTS' | 'DB_HOST' | 'DB_PORT' | 'DB_USER' | 'DB_PASSWORD' | 'DB_NAME' | 'DB_POOL_SIZE'>;

/**
 * One definition of how to reach MySQL, used by the app, the migration CLI, the tests and the
 * benchmarks. With DB_HOSTS, connections fail over between the hosts (failover-pool.ts).
 */
export function dataSourceOptions(c: DbConfig): MysqlDataSourceOptions {
  return {
    type: 'mysql',
    ...(c.DB_HOSTS !== undefined ? { driver: failoverDriver(databaseHosts(c)) } : {}),
    host: c.DB_HOST,
    port: c.DB_PORT,
    username: c.DB_USER,
    password: c.DB_PASSWORD,
    database: c.DB_NAME,
    charset: 'utf8mb4_unicode_ci',
    timezone: SESSION_TIME_ZONE,
    supportBigNumbers: true,
    bigNumberStrings: true,
    poolSize: c.DB_POOL_SIZE,
    synchronize: false,
    migrations,
    migrationsTransactionMode: 'each',
    logging: false,
    extra: {
      // Date objects to and from DATETIME values as UTC. The session keeps the server's time_zone:
      // see docs/hardening.md for the few NOW(3)s, which are compared only with NOW(3).
      timezone: SESSION_TIME_ZONE,
      queryFormat: formatQuery,
      connectTimeout: 5000,
      enableKeepAlive: true,
      maxIdle: c.DB_POOL_SIZE,
      idleTimeout: 60_000,
      // mysql2 otherwise captures a stack trace on every statement, for errors it rarely has (3.6 % of
      // the server's CPU under the mixed sale load). TypeORM's QueryFailedError still carries the
      // awaiting code's async stack; only its driverError's stack is mysql2's own frames.
      trace: false,
    },
  };
}
