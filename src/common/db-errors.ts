/** MySQL/MariaDB error numbers the service reacts to. */
export const ER_DUP_ENTRY = 1062;
export const ER_LOCK_WAIT_TIMEOUT = 1205;
export const ER_LOCK_DEADLOCK = 1213;

/** Errors that mean "the database is not available for this write right now", never the client's fault. */
const OUTAGE_ERRNOS = new Set([
  1040, // too many connections
  1047, // Galera: WSREP has not yet prepared node for application use (not synced, or not in the primary component)
  1053, // server shutdown in progress
  1203, // user has too many connections
  1205, // lock wait timeout (after retries)
  1213, // deadlock (after retries)
  1290, // read-only (--read-only)
  1792, // read-only transaction
  1836, // read-only mode
  1927, // connection killed (MariaDB)
  2006, // server has gone away
  2013, // lost connection during query
  3024, // query execution interrupted, max_execution_time
  1317, // query interrupted
]);
const OUTAGE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'PROTOCOL_CONNECTION_LOST',
  'PROTOCOL_SEQUENCE_TIMEOUT',
  'POOL_CLOSED',
  'POOL_ACQUIRE_TIMEOUT',
  'POOL_NONEONLINE', // every DB_HOSTS host failed its last connection attempt
  'POOL_NOEXIST',
  'ER_CON_COUNT_ERROR',
]);

function driverError(err: unknown): { errno?: number; code?: string; message?: string } | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  const e = err as { errno?: number; code?: string; driverError?: unknown; message?: string };
  if (e.driverError && typeof e.driverError === 'object') return e.driverError as { errno?: number; code?: string };
  return e;
}

export function errnoOf(err: unknown): number | undefined {
  return driverError(err)?.errno;
}

export function isRetryableTxError(err: unknown): boolean {
  const n = errnoOf(err);
  return n === ER_LOCK_DEADLOCK || n === ER_LOCK_WAIT_TIMEOUT;
}

export function isDuplicateKey(err: unknown): boolean {
  return errnoOf(err) === ER_DUP_ENTRY;
}

export function isDatabaseOutage(err: unknown): boolean {
  const e = driverError(err);
  if (!e) return false;
  if (e.errno !== undefined && OUTAGE_ERRNOS.has(e.errno)) return true;
  if (e.code !== undefined && OUTAGE_CODES.has(e.code)) return true;
  const msg = e.message ?? '';
  return /Pool is closed|Connection lost|Can't add new command when connection is in closed state|connect ECONNREFUSED/.test(msg);
}

/** A statement or a wait for a connection cut off by its time limit: a request's deadline, or a job's statement timeout. */
export function isDeadlineTimeout(err: unknown): boolean {
  const code = driverError(err)?.code;
  return code === 'PROTOCOL_SEQUENCE_TIMEOUT' || code === 'POOL_ACQUIRE_TIMEOUT';
}

/**
 * What a 503 for a database error tells the client. "Not available" for a lock held too long by
 * other work (the database answering every other request) sent operators looking for an outage.
 */
export function outageMessage(err: unknown): string {
  if (isRetryableTxError(err)) return 'The data this request needs was held by other work for too long; retry shortly';
  if (isDeadlineTimeout(err))
    // A statement waiting on a row another request holds (a busy order, a hot coupon) ends here too.
    return "The database did not answer within the request's deadline (busy, or the data was held by other work); retry shortly";
  return 'The database is not available right now; retry shortly';
}
