import { setTimeout as sleep } from 'node:timers/promises';
import { Injectable, Logger, OnApplicationBootstrap } from '@nestjs/common';
import { DataSource, EntityManager, QueryRunner } from 'typeorm';
import { AppConfig, databaseHosts } from '../config/app-config.js';
import { errnoOf, isRetryableTxError } from '../common/db-errors.js';
import { counter } from '../common/metrics.js';
import { identify, leavesOutcomeOpen, LostCommitRolledBack, OutcomeSettings, resolveOutcome, STAMP_SQL } from './outcome.js';

const retriesTotal = counter(
  'db_transaction_retries_total',
  'Transactions retried after a deadlock, a lock-wait timeout, or a lost COMMIT found not to have committed (errno lost-commit)',
  ['errno'],
);

/**
 * The one way to run a transaction. READ COMMITTED, so a statement that waited on a row lock sees
 * what the lock holder committed; a deadlock (1213, also Galera's certification failure at COMMIT)
 * or lock-wait timeout (1205) rolls the whole attempt back and runs `fn` again in a fresh
 * transaction, at most `retries` times. `fn` must therefore have no side effects outside the
 * EntityManager it is given. For code without Nest (bootstrap, leases); the app injects
 * TransactionService.
 *
 * With `outcome`, a COMMIT whose answer is lost is not reported as a failure: the transaction's
 * outcome is found out (outcome.ts) and the committed result returned, or the transaction runs
 * again as if it had never happened (counted as a retry), or, with the database unreachable past
 * OUTCOME_RESOLVE_MS, OUTCOME_UNKNOWN (503) is thrown. With `outcome` the data source must be one of
 * deadlineDriver's pools, whose connections are READ COMMITTED by session (SESSION_ISOLATION):
 * such a transaction sends no level of its own.
 */
export async function runTransaction<T>(
  dataSource: DataSource,
  retries: number,
  fn: (em: EntityManager) => Promise<T>,
  outcome?: OutcomeSettings,
): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await (outcome ? resolvingTransaction(dataSource, fn, outcome) : dataSource.transaction('READ COMMITTED', fn));
    } catch (err) {
      const lostCommit = err instanceof LostCommitRolledBack;
      if (!(lostCommit || isRetryableTxError(err)) || attempt >= retries) throw lostCommit ? err.commitError : err;
      retriesTotal.inc({ errno: lostCommit ? 'lost-commit' : String(errnoOf(err) ?? '') });
      await sleep(5 * 2 ** attempt + Math.random() * 10);
    }
  }
}

/** One attempt: its connection's stamp, `fn`, then COMMIT; a lost COMMIT answer is resolved. */
async function resolvingTransaction<T>(
  dataSource: DataSource,
  fn: (em: EntityManager) => Promise<T>,
  settings: OutcomeSettings,
): Promise<T> {
  const qr = dataSource.createQueryRunner('master');
  try {
    await qr.connect();
    // The app's connections are READ COMMITTED by session (deadline-pool.ts): no SET TRANSACTION needed.
    await qr.startTransaction();
    const id = identify(qr);
    let result: T;
    try {
      // First, before `fn` takes its row locks: the stamp's row is this connection's alone, so it
      // waits for nobody, and the locks of a hot row are not held a statement longer.
      await qr.query(STAMP_SQL, [id.slot, id.txId]);
      result = await fn(qr.manager);
    } catch (err) {
      // No COMMIT was sent: nothing of this attempt can commit.
      await qr.rollbackTransaction().catch(() => undefined);
      throw err;
    }
    try {
      await qr.commitTransaction();
    } catch (err) {
      if (!leavesOutcomeOpen(err)) {
        await qr.rollbackTransaction().catch(() => undefined);
        throw err;
      }
      if ((await resolveOutcome(id, settings)) === 'rolled_back') throw new LostCommitRolledBack(err);
    }
    return result;
  } finally {
    await qr.release().catch(() => undefined);
  }
}

/**
 * Runs `fn` on `q` in a read-only transaction whose reads all see one snapshot: an answer read in
 * several statements (rows, then their children) shows no write committed between two of them.
 */
export async function inSnapshot<T>(q: QueryRunner, fn: () => Promise<T>): Promise<T> {
  try {
    // For this transaction only: the session stays READ COMMITTED for the writes that follow on it.
    await q.query('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ');
    await q.query('START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY');
  } catch (err) {
    // The level would stay pending for the connection's next transaction, a write's (a Galera node
    // out of the majority takes the SET and refuses the START).
    discardConnection(q);
    throw err;
  }
  let result: T;
  try {
    result = await fn();
  } catch (err) {
    // A failed ROLLBACK would leave the snapshot open on a pooled connection; fn's error is the one to report.
    await q.query('ROLLBACK').catch(() => discardConnection(q));
    throw err;
  }
  // Nothing to commit but the end of the snapshot: a COMMIT that fails loses no read, only the connection.
  await q.query('COMMIT').catch(() => discardConnection(q));
  return result;
}

/** Closes `q`'s connection instead of handing it back to the pool in a state the next user would inherit. */
function discardConnection(q: QueryRunner): void {
  (q as unknown as { databaseConnection?: { destroy(): void } }).databaseConnection?.destroy();
}

/** inSnapshot on a connection of its own, for a read that spans statements. */
export async function readSnapshot<T>(dataSource: DataSource, fn: (em: EntityManager) => Promise<T>): Promise<T> {
  const q = dataSource.createQueryRunner();
  try {
    return await inSnapshot(q, () => fn(q.manager));
  } finally {
    await q.release();
  }
}

/** How long a connection's tx_marker row is kept after its last transaction (a lost COMMIT is resolved within seconds). */
const MARKER_KEEP_HOURS = 24;

/** runTransaction with DB_TX_RETRIES on the app's pool, resolving lost COMMIT answers. */
@Injectable()
export class TransactionService implements OnApplicationBootstrap {
  private readonly outcome: OutcomeSettings;

  constructor(
    private readonly dataSource: DataSource,
    private readonly config: AppConfig,
  ) {
    this.outcome = {
      hosts: databaseHosts(config),
      user: config.DB_USER,
      password: config.DB_PASSWORD,
      database: config.DB_NAME,
      resolveMs: config.OUTCOME_RESOLVE_MS,
    };
  }

  inTransaction<T>(fn: (em: EntityManager) => Promise<T>): Promise<T> {
    return runTransaction(this.dataSource, this.config.DB_TX_RETRIES, fn, this.outcome);
  }

  /** tx_marker has a row per connection ever opened; the rows of connections long gone go at each start. */
  async onApplicationBootstrap(): Promise<void> {
    try {
      await this.dataSource.query(`DELETE FROM tx_marker WHERE updated_at < NOW(3) - INTERVAL ? HOUR`, [MARKER_KEEP_HOURS]);
    } catch (err) {
      new Logger('TransactionService').warn(`Could not prune tx_marker: ${(err as Error).message}`);
    }
  }
}

/** Affected rows of an UPDATE/DELETE run through EntityManager.query on the MySQL driver. */
export async function execute(em: EntityManager, sql: string, params: unknown[]): Promise<number> {
  const res = (await em.query(sql, params)) as { affectedRows?: number };
  return res.affectedRows ?? 0;
}
