import type { EntityManager } from 'typeorm';
import type { LogEntry } from '../webhooks/events.js';

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
}

const SELECT = `SELECT l.id, l.user_coupon_id, l.from_status, l.to_status, l.tx_id, l.reason, l.created_at,
  u.coupon_id, u.user_id, u.source, u.issued_at, u.valid_from, u.expires_at, u.used_at
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
          },
  };
}

/** Committed state-log rows with ids above `afterId`, in id order, with their coupon's columns. */
export async function logRowsAfter(em: Pick<EntityManager, 'query'>, afterId: string, limit: number): Promise<LogEntry[]> {
  const rows = (await em.query(`${SELECT} WHERE l.id > ? ORDER BY l.id LIMIT ?`, [afterId, limit])) as FeedRow[];
  return rows.map(toEntry);
}

/** The committed rows among these ids (the relay's open gaps). */
export async function logRowsByIds(em: Pick<EntityManager, 'query'>, ids: readonly string[]): Promise<LogEntry[]> {
  if (ids.length === 0) return [];
  const rows = (await em.query(`${SELECT} WHERE l.id IN (${ids.map(() => '?').join(', ')}) ORDER BY l.id`, ids)) as FeedRow[];
  return rows.map(toEntry);
}

/** When the first row after `afterId` was written, if there is one: the age of the relay's backlog. */
export async function firstRowAtAfter(em: Pick<EntityManager, 'query'>, afterId: string): Promise<Date | null> {
  const rows = (await em.query(`SELECT created_at FROM user_coupon_state_log WHERE id > ? ORDER BY id LIMIT 1`, [afterId])) as {
    created_at: Date;
  }[];
  return rows[0]?.created_at ?? null;
}
