import { EntityManager } from 'typeorm';
import { counter } from '../common/metrics.js';
import { rowsSql } from '../database/sql-rows.js';
import { StateLog } from './state-log.entity.js';
import type { UserCouponStatus } from './transitions.js';

/** Every statement on user_coupon_state_log, inside the caller's transaction. */

type Queryable = Pick<EntityManager, 'query'>;

const transitions = counter(
  'user_coupon_transitions_total',
  'User coupon status transitions written, by from/to (a transaction rolled back afterwards still counts)',
  ['from', 'to'],
);

export interface LogRow {
  userCouponId: string;
  from: UserCouponStatus | null;
  to: UserCouponStatus;
  txId: string;
  reason?: string | null;
  at: Date;
}

/**
 * The first `max` code points of `s`, which is what a VARCHAR(max) column counts: a cut after `max`
 * UTF-16 units could split a surrogate pair, and the column would keep the lone half as U+FFFD.
 */
export function codePointPrefix(s: string, max: number): string {
  // A string has no more code points than UTF-16 units, so most need no walk.
  if (s.length <= max) return s;
  let end = 0;
  for (let n = 0; n < max && end < s.length; n++) end += (s.codePointAt(end) ?? 0) > 0xffff ? 2 : 1;
  return s.slice(0, end);
}

/** Writes state-log rows. Every status change and every issuance goes through here, inside the caller's transaction. */
export async function writeLog(em: Queryable, rows: readonly LogRow[]): Promise<void> {
  if (rows.length === 0) return;
  await em.query(
    `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES ${rowsSql(
      rows.map((r) => [
        r.userCouponId,
        r.from,
        r.to,
        codePointPrefix(r.txId, 191),
        typeof r.reason === 'string' ? codePointPrefix(r.reason, 255) : null,
        r.at,
      ]),
    )}`,
  );
  // One increment per move, not per row: a grab group logs a thousand rows of the same move.
  const moves = new Map<string, number>();
  for (const r of rows) {
    const move = `${r.from ?? 'null'}>${r.to}`;
    moves.set(move, (moves.get(move) ?? 0) + 1);
  }
  for (const [move, n] of moves) {
    const [from, to] = move.split('>');
    transitions.inc({ from, to }, n);
  }
}

function toStateLog(r: Record<string, unknown>): StateLog {
  return Object.assign(new StateLog(), {
    id: String(r.id),
    userCouponId: String(r.user_coupon_id),
    fromStatus: r.from_status as UserCouponStatus | null,
    toStatus: r.to_status as UserCouponStatus,
    txId: r.tx_id as string,
    reason: r.reason as string | null,
    createdAt: r.created_at as Date,
  });
}

/** One coupon's log in the order it was written. */
export async function findLog(em: Queryable, userCouponId: string): Promise<StateLog[]> {
  const rows = (await em.query(`SELECT * FROM user_coupon_state_log WHERE user_coupon_id = ? ORDER BY id`, [userCouponId])) as Record<
    string,
    unknown
  >[];
  return rows.map(toStateLog);
}

/** Reconciliation's approved repair only: takes rows out of a coupon's log (the caller keeps a copy). */
export async function removeLogRows(em: Queryable, userCouponId: string, ids: readonly string[]): Promise<void> {
  await em.query(`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ? AND id IN (?)`, [userCouponId, ids]);
}

/**
 * The webhook relay's feed: one state-log row with the columns of its user coupon that never change after issuance. The
 * status and usedAt of the coupon "as it was at that step" follow from the row itself: the status is
 * the row's `to`, and only a move to USED sets usedAt (USED is final).
 */
export interface LogEntry {
  id: string;
  userCouponId: string;
  from: string | null;
  to: string;
  txId: string;
  reason: string | null;
  at: Date;
  coupon: {
    couponId: string;
    userId: string;
    source: string;
    issuedAt: Date;
    validFrom: Date;
    expiresAt: Date;
    usedAt: Date | null;
    replacesUserCouponId: string | null;
  } | null;
}

interface FeedRow {
  id: string;
  user_coupon_id: string;
  from_status: string | null;
  to_status: string;
  tx_id: string;
  reason: string | null;
  created_at: Date;
  coupon_id: string | null;
  user_id: string | null;
  source: string | null;
  issued_at: Date | null;
  valid_from: Date | null;
  expires_at: Date | null;
  used_at: Date | null;
  replaces_user_coupon_id: string | null;
}

const SELECT = `SELECT l.id, l.user_coupon_id, l.from_status, l.to_status, l.tx_id, l.reason, l.created_at,
  u.coupon_id, u.user_id, u.source, u.issued_at, u.valid_from, u.expires_at, u.used_at, u.replaces_user_coupon_id
  FROM user_coupon_state_log l LEFT JOIN user_coupon u ON u.id = l.user_coupon_id`;

function toEntry(r: FeedRow): LogEntry {
  return {
    id: String(r.id),
    userCouponId: String(r.user_coupon_id),
    from: r.from_status,
    to: r.to_status,
    txId: r.tx_id,
    reason: r.reason,
    at: r.created_at,
    coupon:
      r.coupon_id === null
        ? null
        : {
            couponId: String(r.coupon_id),
            userId: r.user_id as string,
            source: r.source as string,
            issuedAt: r.issued_at as Date,
            validFrom: r.valid_from as Date,
            expiresAt: r.expires_at as Date,
            usedAt: r.used_at,
            replacesUserCouponId: r.replaces_user_coupon_id === null ? null : String(r.replaces_user_coupon_id),
          },
  };
}

/** Committed state-log rows with ids above `afterId`, in id order, with their coupon's columns. */
export async function logRowsAfter(em: Queryable, afterId: string, limit: number): Promise<LogEntry[]> {
  const rows = (await em.query(`${SELECT} WHERE l.id > ? ORDER BY l.id LIMIT ?`, [afterId, limit])) as FeedRow[];
  return rows.map(toEntry);
}

/**
 * The committed rows with ids in these ranges (the relay's open gaps, `lo` and `hi` included), in id
 * order: one primary-key range each, so a gap costs the rows it holds, not its width.
 */
export async function logRowsInRanges(em: Queryable, ranges: readonly { lo: bigint; hi: bigint }[]): Promise<LogEntry[]> {
  if (ranges.length === 0) return [];
  const rows = (await em.query(
    `${SELECT} WHERE ${ranges.map(() => 'l.id BETWEEN ? AND ?').join(' OR ')} ORDER BY l.id`,
    ranges.flatMap((r) => [String(r.lo), String(r.hi)]),
  )) as FeedRow[];
  return rows.map(toEntry);
}

/** When the first row after `afterId` was written, if there is one: the age of the relay's backlog. */
export async function firstRowAtAfter(em: Queryable, afterId: string): Promise<Date | null> {
  const rows = (await em.query(`SELECT created_at FROM user_coupon_state_log WHERE id > ? ORDER BY id LIMIT 1`, [afterId])) as {
    created_at: Date;
  }[];
  return rows[0]?.created_at ?? null;
}
