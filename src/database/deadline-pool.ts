import { AsyncLocalStorage } from 'node:async_hooks';
import mysql2 from 'mysql2';
import type { AppConfig } from '../config/app-config.js';

type Limits = Pick<
  AppConfig,
  'DB_STATEMENT_TIMEOUT_MS' | 'DB_LOCK_WAIT_TIMEOUT_SECONDS' | 'DB_IDLE_TRANSACTION_TIMEOUT_SECONDS' | 'DB_ACQUIRE_TIMEOUT_MS'
>;
type Callback = (err: unknown, ...rest: unknown[]) => void;
type GetConnection = (cb: (err: NodeJS.ErrnoException | null, conn?: mysql2.PoolConnection) => void) => void;

/** The code of the error a connection request gets when no connection came in time (an outage: 503). */
export const POOL_ACQUIRE_TIMEOUT = 'POOL_ACQUIRE_TIMEOUT';

/** Marks the error of a statement that was never sent (so a COMMIT that got it certainly did not commit). */
export const NOT_SENT = Symbol('not sent');

/** Left for writing the 503 before the request's deadline, when the database used up its time. */
const ANSWER_MARGIN_MS = 250;

/** A request's deadline (epoch ms), while the request waits for its answer. */
export interface Deadline {
  at: number;
  /**
   * Set once the request is answered (not by its deadline): work it started that goes on in the
   * background (a reconciliation run after its 202) is a job from then on, with the job limits.
   */
  answered: boolean;
}

const deadlines = new AsyncLocalStorage<Deadline>();

/** The deadline of a request that began `elapsedMs` ago and may take `timeoutMs`. */
export function deadlineOf(timeoutMs: number, elapsedMs = 0): Deadline {
  return { at: Date.now() - elapsedMs + timeoutMs, answered: false };
}

/** Once the request is answered: work a 503 or a 408 (its deadline, or an outage) left behind stays bound by the deadline. */
export function settleDeadline(deadline: Deadline, status: number): void {
  if (status !== 503 && status !== 408) deadline.answered = true;
}

/** Runs `fn` (a request's handling) under `deadline`: database waits started inside end before it. */
export function withDeadline(deadline: Deadline, fn: () => void): void {
  deadlines.run(deadline, fn);
}

/** The deadline of the request being handled here, if any (work started for it outlives the call stack). */
export function currentDeadline(): Deadline | undefined {
  return deadlines.getStore();
}

/** Whether a database wait could still start before `deadline`. */
export function hasTimeLeft(deadline: Deadline, atLeastMs = 0): boolean {
  return deadline.answered || deadline.at - ANSWER_MARGIN_MS - atLeastMs > Date.now();
}

/** Runs work shared by several requests (a grab group) under one deadline: the earliest of theirs. */
export function runWithDeadline<T>(deadline: Deadline, fn: () => Promise<T>): Promise<T> {
  return deadlines.run(deadline, fn);
}

/** Milliseconds a database wait may take: before the current request's deadline, else `outside`. */
export function budget(outside: number): number {
  const d = deadlines.getStore();
  return d === undefined || d.answered ? outside : d.at - ANSWER_MARGIN_MS - Date.now();
}

/** Left, after a poll's wait ends, for its last look at the database and the answer. */
const LAST_LOOK_MS = 500;

/**
 * When a poll of at most `ms` (a repeat waiting for the first request's work) must stop: early
 * enough before the current request's deadline that its last look at the database still gets its
 * statement sent and answered (a 50 ms sleep that wakes late on a busy machine must not turn the
 * answer into a 503).
 */
export function pollUntil(ms: number): number {
  return Date.now() + Math.min(ms, budget(ms + LAST_LOOK_MS) - LAST_LOOK_MS);
}

function timeoutError(code: string, message: string): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error(message);
  err.code = code;
  return err;
}

/**
 * The isolation level of every serving connection, set once when it opens: the app's transactions
 * begin without a `SET TRANSACTION ISOLATION LEVEL` of their own, a round trip fewer each (a grab
 * group waits for each of its round trips behind a turn of the event loop full of requests).
 */
export const SESSION_ISOLATION = 'READ COMMITTED';

/**
 * A mysql2 module (for TypeORM's `driver` option) whose pools bound every wait on the database, so
 * a stalled server (SIGSTOP, a hung disk, a black-holed network) ends a request in 503 before its
 * deadline instead of hanging it: the TCP connection stays open and nothing ever answers, so only
 * the client's own clocks can end the wait. Inside a request (withDeadline) every wait ends before
 * the request's deadline, so no work of a request answered 503 goes on after it; in jobs:
 * - acquiring a connection (queueing for a free one, or opening one) gives up at the request's
 *   deadline (queueing for a connection is also what a burst does), in jobs after
 *   DB_ACQUIRE_TIMEOUT_MS; a connection that arrives later goes back to the pool;
 * - a statement gives up at the request's deadline (one that would start after it is not sent),
 *   in jobs after DB_STATEMENT_TIMEOUT_MS, and its connection is destroyed
 *   (mysql2's timeout only stops waiting: the statement would still occupy the connection, and the
 *   ROLLBACK queued behind it would hang too); the server rolls back the open transaction when it
 *   sees the connection gone;
 * - row-lock waits end after DB_LOCK_WAIT_TIMEOUT_SECONDS (innodb_lock_wait_timeout, 50 s by
 *   default), set once per connection, so the retries of a lock-wait timeout fit in a request's deadline;
 * - on MariaDB, a session idle inside a transaction for DB_IDLE_TRANSACTION_TIMEOUT_SECONDS is
 *   closed by the server: a destroyed connection the server never heard of (a network partition)
 *   would otherwise keep its transaction's row locks.
 * TypeORM's own query timeout (enableQueryTimeout) does only the middle part's first half, and logs
 * the text of every timed-out statement to the console.
 */
export function deadlineDriver(base: typeof mysql2, limits: Limits): typeof mysql2 {
  return {
    ...base,
    createPool(options: mysql2.PoolOptions) {
      const pool = base.createPool(options);
      const prepared = new WeakSet<mysql2.PoolConnection>();
      const getConnection: GetConnection = (cb) => {
        let settled = false;
        const waitMs = budget(limits.DB_ACQUIRE_TIMEOUT_MS);
        const timer = setTimeout(
          () => {
            settled = true;
            cb(timeoutError(POOL_ACQUIRE_TIMEOUT, `No database connection within ${Math.round(waitMs)} ms`));
          },
          Math.max(0, waitMs),
        );
        const hand = (err: NodeJS.ErrnoException | null, conn?: mysql2.PoolConnection) => {
          if (settled) {
            conn?.release();
            return;
          }
          settled = true;
          clearTimeout(timer);
          cb(err, conn);
        };
        // Bound to this caller's context: mysql2 hands a queued caller its connection from the code that
        // freed one, so the connection's set-up ran under that request's deadline, and a request whose
        // timed-out connection was destroyed failed the next one queued at the same instant.
        (pool.getConnection as GetConnection)(
          AsyncLocalStorage.bind((err: NodeJS.ErrnoException | null, conn?: mysql2.PoolConnection) => {
            if (err || !conn) return hand(err);
            if (prepared.has(conn)) return hand(null, conn);
            withStatementTimeout(conn, limits.DB_STATEMENT_TIMEOUT_MS);
            // `/*M! … */` is run by MariaDB only: MySQL has no idle_transaction_timeout.
            // 0 leaves the server's own setting.
            const idle = limits.DB_IDLE_TRANSACTION_TIMEOUT_SECONDS;
            const set = `SET SESSION innodb_lock_wait_timeout = ${limits.DB_LOCK_WAIT_TIMEOUT_SECONDS}${idle > 0 ? ` /*M!, idle_transaction_timeout = ${idle} */` : ''}`;
            const failed = (setErr: unknown) => {
              if (!setErr) return false;
              conn.destroy();
              hand(setErr as NodeJS.ErrnoException);
              return true;
            };
            // A statement's callback runs in the context its connection was opened in: bound too.
            conn.query(
              set,
              AsyncLocalStorage.bind((setErr: unknown) => {
                if (failed(setErr)) return;
                conn.query(`SET SESSION TRANSACTION ISOLATION LEVEL ${SESSION_ISOLATION}`, (isoErr) => {
                  if (failed(isoErr)) return;
                  prepared.add(conn);
                  hand(null, conn);
                });
              }),
            );
          }),
        );
      };
      // The two methods TypeORM's MysqlDriver calls on its pool.
      return {
        getConnection,
        end: (cb?: (err: NodeJS.ErrnoException | null) => void) => pool.end(cb),
        // For the pool gauges (health/database-metrics.ts), which read the pool underneath.
        inner: pool,
      } as unknown as mysql2.Pool;
    },
  } as typeof mysql2;
}

/** Every callback-style query on `conn` gets a timeout (see deadlineDriver); when one times out, the connection is destroyed. */
function withStatementTimeout(conn: mysql2.PoolConnection, timeoutMs: number): void {
  const query = conn.query.bind(conn) as (...args: unknown[]) => unknown;
  const destroy = () => {
    conn.destroy();
    (conn as unknown as { stream?: { destroy?: () => void } }).stream?.destroy?.();
  };
  (conn as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    const cb = args[args.length - 1];
    // Without a callback it is a stream (read row by row, for as long as it takes): left as it is.
    if (typeof cb !== 'function') return query(...args);
    const limit = budget(timeoutMs);
    if (limit <= 0) {
      // Not sent (a COMMIT sent now could commit after the client was told 503); the server rolls back what is open.
      destroy();
      const notSent = Object.assign(timeoutError('PROTOCOL_SEQUENCE_TIMEOUT', "The request's deadline passed before this statement"), {
        [NOT_SENT]: true,
      });
      process.nextTick(cb as Callback, notSent);
      return undefined;
    }
    const sql = args[0];
    args[0] = typeof sql === 'string' ? { sql, timeout: limit } : { ...(sql as object), timeout: limit };
    let answered = false;
    // The statement's command, once query() returned (a closed connection calls back inside it).
    const sent: { command?: { queryTimeout?: NodeJS.Timeout | null } } = {};
    args[args.length - 1] = (err: unknown, ...rest: unknown[]) => {
      // mysql2 clears a statement's timer only when the statement ends: when the connection dies
      // under it, the timer stays (keeping the process alive on shutdown) and calls back a second
      // time with a timeout (sidorares/node-mysql2#1387).
      if (answered) return;
      answered = true;
      if (sent.command?.queryTimeout) {
        clearTimeout(sent.command.queryTimeout);
        sent.command.queryTimeout = null;
      }
      if ((err as { code?: string } | null)?.code === 'PROTOCOL_SEQUENCE_TIMEOUT') destroy();
      (cb as Callback)(err, ...rest);
    };
    sent.command = query(...args) as typeof sent.command;
    return sent.command;
  };
}
