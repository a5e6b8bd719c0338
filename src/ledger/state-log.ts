import { EntityManager } from 'typeorm';
import { counter } from '../common/metrics.js';
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

/** Writes state-log rows. Every status change and every issuance goes through here, inside the caller's transaction. */
export async function writeLog(em: Queryable, rows: readonly LogRow[]): Promise<void> {
  if (rows.length === 0) return;
  await em.query(
    `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES ${rows.map(() => '(?, ?, ?, ?, ?, ?)').join(', ')}`,
    rows.flatMap((r) => [r.userCouponId, r.from, r.to, r.txId.slice(0, 191), r.reason?.slice(0, 255) ?? null, r.at]),
  );
  for (const r of rows) transitions.inc({ from: r.from ?? 'null', to: r.to });
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

/** Log rows written after the row `afterId` (0: from the start), in id order, at most `limit`: a feed to follow the ledger by. */
export async function logAfter(em: Queryable, afterId: string, limit: number): Promise<StateLog[]> {
  const rows = (await em.query(`SELECT * FROM user_coupon_state_log WHERE id > ? ORDER BY id LIMIT ?`, [afterId, limit])) as Record<
    string,
    unknown
  >[];
  return rows.map(toStateLog);
}
