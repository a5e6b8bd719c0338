import { Injectable } from '@nestjs/common';
import { DataSource, EntityManager } from 'typeorm';
import { AppConfig } from '../config/app-config.js';
import { isRetryableTxError } from '../common/db-errors.js';
import { counter } from '../common/metrics.js';

const retriesTotal = counter('db_transaction_retries_total', 'Transactions retried after a deadlock or lock-wait timeout', ['errno']);

/**
 * The one way to run a transaction. READ COMMITTED, so a statement that waited on a row lock sees
 * what the lock holder committed; a deadlock (1213, also Galera's certification failure at COMMIT)
 * or lock-wait timeout (1205) rolls the whole attempt back and runs `fn` again in a fresh
 * transaction, at most `retries` times. `fn` must therefore have no side effects outside the
 * EntityManager it is given. For code without Nest (bootstrap, leases); the app injects
 * TransactionService.
 */
export async function runTransaction<T>(dataSource: DataSource, retries: number, fn: (em: EntityManager) => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await dataSource.transaction('READ COMMITTED', fn);
    } catch (err) {
      if (!isRetryableTxError(err) || attempt >= retries) throw err;
      retriesTotal.inc({ errno: String((err as { driverError?: { errno?: number } }).driverError?.errno ?? '') });
      await new Promise((r) => setTimeout(r, 5 * 2 ** attempt + Math.random() * 10));
    }
  }
}

/** runTransaction with DB_TX_RETRIES on the app's pool. */
@Injectable()
export class TransactionService {
  constructor(
    private readonly dataSource: DataSource,
    private readonly config: AppConfig,
  ) {}

  inTransaction<T>(fn: (em: EntityManager) => Promise<T>): Promise<T> {
    return runTransaction(this.dataSource, this.config.DB_TX_RETRIES, fn);
  }
}

/** Affected rows of an UPDATE/DELETE run through EntityManager.query on the MySQL driver. */
export async function execute(em: EntityManager, sql: string, params: unknown[]): Promise<number> {
  const res = (await em.query(sql, params)) as { affectedRows?: number };
  return res.affectedRows ?? 0;
}
