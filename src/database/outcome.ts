import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import mysql from 'mysql2/promise';
import type { QueryRunner } from 'typeorm';
import type { DatabaseHost } from '../config/app-config.js';
import { errnoOf, isDatabaseOutage } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { counter, histogram } from '../common/metrics.js';
import { budget, NOT_SENT } from './deadline-pool.js';
import { PROCESS_ID } from './process-identity.js';

const unknownTotal = counter(
  'db_commit_outcome_unknown_total',
  'COMMITs whose answer was lost (connection gone), so the outcome had to be found out',
  [],
);
const resolvedTotal = counter(
  'db_commit_outcome_resolved_total',
  'Lost COMMIT answers by what was found: committed, rolled_back, or unknown (the database stayed unreachable)',
  ['outcome'],
);
const resolveSeconds = histogram(
  'db_commit_outcome_resolve_seconds',
  'Time taken to find out the outcome of a lost COMMIT',
  ['outcome'],
  [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
);

export interface OutcomeSettings {
  /** Where to look: the transaction's own host first, then (DB_HOSTS) the others. */
  hosts: DatabaseHost[];
  user: string;
  password: string;
  database: string;
  /** How long to keep trying before answering OUTCOME_UNKNOWN (never past the request's deadline). */
  resolveMs: number;
}

/** A transaction as the database knows it: which server session ran it, and the stamp it wrote. */
export interface TxIdentity {
  host: string;
  port: number;
  threadId: number;
  slot: string;
  txId: string;
}

/** The first statement of every app transaction: its connection's row names this transaction. */
export const STAMP_SQL = `INSERT INTO tx_marker (slot, tx_id, updated_at) VALUES (?, ?, NOW(3)) ON DUPLICATE KEY UPDATE tx_id = VALUES(tx_id), updated_at = VALUES(updated_at)`;

interface MysqlConnectionInfo {
  threadId: number;
  config: { host: string; port: number };
}

export function identify(qr: QueryRunner): TxIdentity {
  const conn = (qr as unknown as { databaseConnection: MysqlConnectionInfo }).databaseConnection;
  const { host, port } = conn.config;
  return {
    host,
    port,
    threadId: conn.threadId,
    slot: `${PROCESS_ID}/${host}:${port}/${conn.threadId}`,
    txId: randomBytes(16).toString('hex'),
  };
}

/**
 * Server answers to a COMMIT that are final: the transaction was rolled back (a deadlock or
 * Galera certification failure, a lock-wait timeout, read-only, too many connections, node not
 * ready). Any other outage (the connection dropped, timed out, was killed, the server shut down)
 * leaves open whether the COMMIT took effect.
 */
const FINAL_COMMIT_ERRNOS = new Set([1040, 1047, 1203, 1205, 1213, 1290, 1792, 1836]);

export function leavesOutcomeOpen(commitError: unknown): boolean {
  const errno = errnoOf(commitError);
  const driverError = (commitError as { driverError?: Record<symbol, unknown> } | null)?.driverError;
  if (driverError?.[NOT_SENT]) return false;
  return isDatabaseOutage(commitError) && (errno === undefined || !FINAL_COMMIT_ERRNOS.has(errno));
}

/** The lost COMMIT was found not to have committed: the transaction may run again as if it never happened. */
export class LostCommitRolledBack extends Error {
  constructor(readonly commitError: unknown) {
    super('The COMMIT was lost and the transaction did not commit');
  }
}

async function connectTo(h: DatabaseHost, s: OutcomeSettings, deadline: number): Promise<mysql.Connection | null> {
  try {
    return await mysql.createConnection({
      host: h.host,
      port: h.port,
      user: s.user,
      password: s.password,
      database: s.database,
      connectTimeout: Math.max(200, Math.min(1000, deadline - Date.now())),
    });
  } catch {
    return null;
  }
}

async function stamped(conn: mysql.Connection, id: TxIdentity): Promise<boolean> {
  const [rows] = await conn.query<mysql.RowDataPacket[]>(`SELECT tx_id FROM tx_marker WHERE slot = ?`, [id.slot]);
  return rows[0]?.tx_id === id.txId;
}

/**
 * On the transaction's own server: committed if its stamp is there; rolled back once its session
 * is gone from the processlist and the stamp is still not there (a session that is gone has
 * finished its COMMIT, or rolled back). A session still there (the server did not notice the
 * cut, or it is idle in the transaction) is killed, so the answer becomes final and its locks go.
 */
async function askSameServer(conn: mysql.Connection, id: TxIdentity, s: OutcomeSettings): Promise<'committed' | 'rolled_back' | null> {
  if (await stamped(conn, id)) return 'committed';
  const [sessions] = await conn.query<mysql.RowDataPacket[]>(
    `SELECT COUNT(*) AS n FROM information_schema.processlist WHERE id = ? AND user = ? AND db = ?`,
    [id.threadId, s.user, s.database],
  );
  if (Number(sessions[0].n) === 0) return (await stamped(conn, id)) ? 'committed' : 'rolled_back';
  await conn.query(`KILL CONNECTION ${Number(id.threadId)}`).catch(() => undefined);
  return null;
}

/**
 * On another Galera node, with causal reads: the stamp there means committed (the cluster
 * certified it). Its absence is final only once the transaction's node has left the primary
 * component: a write set is delivered to all survivors or to none, so after that view change
 * nothing of the old node can still arrive.
 */
async function askOtherNode(conn: mysql.Connection, id: TxIdentity): Promise<'committed' | 'rolled_back' | null> {
  try {
    await conn.query('SET SESSION wsrep_sync_wait = 1');
  } catch {
    return null; // not Galera: another server cannot say what the first one did
  }
  if (await stamped(conn, id)) return 'committed';
  const [rows] = await conn.query<mysql.RowDataPacket[]>(
    `SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_cluster_status', 'wsrep_incoming_addresses')`,
  );
  const status = Object.fromEntries(rows.map((r) => [String(r.Variable_name), String(r.Value)]));
  const members = (status.wsrep_incoming_addresses ?? '').split(',');
  if (status.wsrep_cluster_status !== 'Primary' || members.includes(`${id.host}:${id.port}`)) return null;
  return (await stamped(conn, id)) ? 'committed' : 'rolled_back';
}

/**
 * The least time taken to find out, even with the request's database time used up (ANSWER_MARGIN_MS,
 * 250, is left for the answer). A COMMIT sent just before that time ran out is given what remained as
 * its timeout; one that outlives it had usually committed, and a database that answers says so in a
 * few milliseconds. Without this, such a change was answered 503 OUTCOME_UNKNOWN with no look at all
 * (once in ten runs of 500 holds and redemptions fired at one order at once): a 5xx for a committed
 * change, which API.md rules out.
 */
const MIN_LOOK_MS = 150;

/**
 * Finds out whether the transaction whose COMMIT answer was lost committed, on fresh connections of
 * its own (the pool may be exhausted or pointing elsewhere). Throws OUTCOME_UNKNOWN (503) when no
 * final answer could be had within `resolveMs`.
 */
export async function resolveOutcome(id: TxIdentity, s: OutcomeSettings): Promise<'committed' | 'rolled_back'> {
  unknownTotal.inc();
  const started = performance.now();
  // Within the request's deadline too: past it the request is answered 503 anyway, so it had better
  // be this one. But at least MIN_LOOK_MS, taken from the margin the deadline leaves for the answer.
  const deadline = Date.now() + Math.min(s.resolveMs, Math.max(MIN_LOOK_MS, budget(s.resolveMs)));
  const others = s.hosts.filter((h) => h.host !== id.host || h.port !== id.port);
  while (Date.now() < deadline) {
    for (const [host, ask] of [
      [{ host: id.host, port: id.port }, (c: mysql.Connection) => askSameServer(c, id, s)],
      ...others.map((h) => [h, (c: mysql.Connection) => askOtherNode(c, id)] as const),
    ] as const) {
      const conn = await connectTo(host, s, deadline);
      if (!conn) continue;
      try {
        const outcome = await ask(conn);
        if (outcome) {
          resolvedTotal.inc({ outcome });
          resolveSeconds.observe({ outcome }, (performance.now() - started) / 1000);
          return outcome;
        }
      } catch {
        // That server failed mid-question: try the next one, or again.
      } finally {
        await conn.end().catch(() => conn.destroy());
      }
    }
    await sleep(100);
  }
  resolvedTotal.inc({ outcome: 'unknown' });
  resolveSeconds.observe({ outcome: 'unknown' }, (performance.now() - started) / 1000);
  throw new AppError(
    'OUTCOME_UNKNOWN',
    'The database stopped answering while this change was being committed, and could not be reached to learn whether it was; look it up before retrying',
    { resolveMs: s.resolveMs },
    { 'Retry-After': '1' },
  );
}

/** An OUTCOME_UNKNOWN answer names how the client finds out (the grab's key, the order); anything else passes unchanged. */
export function withLookup(err: unknown, lookup: Record<string, unknown>): unknown {
  if (!(err instanceof AppError) || err.code !== 'OUTCOME_UNKNOWN') return err;
  return new AppError(err.code, err.message, { ...err.details, ...lookup }, err.headers);
}
