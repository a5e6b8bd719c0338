import { EntityManager, getMetadataArgsStorage } from 'typeorm';
import { rowsSql, sqlLiteral } from '../database/sql-rows.js';
import { execute } from '../database/transaction.service.js';
import { USER_COUPON_STATUSES, type UserCouponStatus } from './transitions.js';
import { effectiveStatusSql, UserCoupon } from './user-coupon.entity.js';

/**
 * Every statement on user_coupon. Plain SQL with the EntityManager of the caller's transaction: on
 * the grab path, building a 500-branch OR through the query builder cost more than the query.
 */

type Queryable = Pick<EntityManager, 'query'>;

interface ColumnMap {
  property: keyof UserCoupon;
  name: string;
  /** The driver answers BIGINT as a string or (insertId) a number, and BOOLEAN as 0/1. */
  read: (v: unknown) => unknown;
}

/** The columns as the entity declares them: the one list the INSERT and the row mapper are built from. */
const COLUMNS: readonly ColumnMap[] = getMetadataArgsStorage()
  .filterColumns(UserCoupon)
  .map((c) => ({
    property: c.propertyName as keyof UserCoupon,
    name: c.options.name ?? c.propertyName,
    read:
      c.options.type === 'bigint'
        ? (v: unknown) => (v === null ? null : String(v))
        : c.options.type === 'boolean'
          ? (v: unknown) => Boolean(v)
          : (v: unknown) => v,
  }));
/** The id is generated. */
const INSERTED = COLUMNS.filter((c) => c.property !== 'id');
const INSERT = `INSERT INTO user_coupon (${INSERTED.map((c) => c.name).join(', ')}) VALUES `;

export function toUserCoupon(row: Record<string, unknown>): UserCoupon {
  const uc = new UserCoupon();
  for (const c of COLUMNS) (uc as unknown as Record<string, unknown>)[c.property] = c.read(row[c.name]);
  return uc;
}

/** A new user coupon's id with the (user, idempotency key) it was issued under. */
export interface KeyedId {
  id: string;
  userId: string;
  key: string;
}
type KeyedIdRow = { id: number | string; user_id: string; idempotency_key: string };
const toKeyedId = (r: KeyedIdRow): KeyedId => ({ id: String(r.id), userId: r.user_id, key: r.idempotency_key });

const insertSql = (rows: readonly Omit<UserCoupon, 'id'>[]) =>
  INSERT + rowsSql(rows.map((uc) => INSERTED.map((c) => uc[c.property as keyof typeof uc])));

/** One multi-row INSERT. Returns the first row's id; the others are not guaranteed consecutive. */
export async function insertUserCoupons(em: Queryable, rows: readonly Omit<UserCoupon, 'id'>[]): Promise<string> {
  const res = (await em.query(insertSql(rows))) as { insertId: number | string };
  return String(res.insertId);
}

/**
 * The same INSERT answering each new row's id with its (user, key), in the same round trip:
 * `INSERT ... RETURNING`, which MariaDB has (10.5+) and MySQL 8 has not.
 */
export async function insertUserCouponsReturningIds(em: Queryable, rows: readonly Omit<UserCoupon, 'id'>[]): Promise<KeyedId[]> {
  const res = (await em.query(`${insertSql(rows)} RETURNING id, user_id, idempotency_key`)) as KeyedIdRow[];
  return res.map(toKeyedId);
}

const keysIn = (pairs: readonly { userId: string; key: string }[]) =>
  `(user_id, idempotency_key) IN (${rowsSql(pairs.map((p) => [p.userId, p.key]))})`;

/** The user coupons issued under these (user, idempotency key) pairs, in one query. */
export async function findByKeys(em: Queryable, pairs: readonly { userId: string; key: string }[]): Promise<UserCoupon[]> {
  if (pairs.length === 0) return [];
  const rows = (await em.query(`SELECT * FROM user_coupon WHERE ${keysIn(pairs)}`)) as Record<string, unknown>[];
  return rows.map(toUserCoupon);
}

/** The ids of the user coupons issued under these (user, idempotency key) pairs: findByKeys without reading the rows. */
export async function idsByKeys(em: Queryable, pairs: readonly { userId: string; key: string }[]): Promise<KeyedId[]> {
  if (pairs.length === 0) return [];
  const rows = (await em.query(`SELECT id, user_id, idempotency_key FROM user_coupon WHERE ${keysIn(pairs)}`)) as KeyedIdRow[];
  return rows.map(toKeyedId);
}

export async function findUserCoupon(em: Queryable, id: string): Promise<UserCoupon | null> {
  const [row] = (await em.query(`SELECT * FROM user_coupon WHERE id = ?`, [id])) as Record<string, unknown>[];
  return row ? toUserCoupon(row) : null;
}

/** The coupon issued to replace this one (a reissue's or a refund's), if any. */
export async function findReplacement(em: Queryable, replacedId: string): Promise<string | null> {
  const [row] = (await em.query(`SELECT id FROM user_coupon WHERE replaces_user_coupon_id = ? ORDER BY id LIMIT 1`, [replacedId])) as {
    id: string;
  }[];
  return row ? String(row.id) : null;
}

/**
 * Locks the row and reads it in one statement (a locking read sees the latest commit). Raw SQL
 * because TypeORM's mysql driver writes a shared lock as FOR SHARE, which MariaDB does not accept.
 */
export async function lockUserCoupon(em: Queryable, id: string, mode: 'shared' | 'exclusive'): Promise<UserCoupon | null> {
  const [row] = (await em.query(`SELECT * FROM user_coupon WHERE id = ? ${mode === 'shared' ? 'LOCK IN SHARE MODE' : 'FOR UPDATE'}`, [
    id,
  ])) as Record<string, unknown>[];
  return row ? toUserCoupon(row) : null;
}

/** Users per statement of countTowardsLimit. */
const COUNT_SLICE = 1000;

/**
 * How many coupons of this coupon count towards each user's perUserLimit: grabs and bulk issues
 * together (invariant 2). Users with none are absent.
 *
 * The plan is pinned: one covering index lookup per listed user. Written as `user_id IN (...)`,
 * MariaDB 10.11 chose, depending on the statistics of the moment, to read every row of the coupon
 * instead (rows examined 31,000 -> 290,000 per 1,000-line batch over a 300,000-line bulk job, the
 * job slowing to half; the same for a grab group on a coupon with many holders).
 */
export async function countTowardsLimit(em: Queryable, couponId: string, userIds: readonly string[]): Promise<Map<string, number>> {
  const users = [...new Set(userIds)];
  const held = new Map<string, number>();
  // A UNION ALL rather than a VALUES list, which MySQL 8 spells differently. CONVERT ... COLLATE makes the comparison
  // the column's own whatever the connection's charset (a utf8mb3 one would otherwise be an illegal mix of collations).
  // Its parse grows faster than its length (1,000 users 3 ms, 10,000 190 ms), hence the slices.
  for (let i = 0; i < users.length; i += COUNT_SLICE) {
    const slice = users.slice(i, i + COUNT_SLICE);
    const rows = (await em.query(
      `SELECT STRAIGHT_JOIN uc.user_id, COUNT(*) AS n
       FROM (SELECT ${slice.map(sqlLiteral).join(' AS user_id UNION ALL SELECT ')} AS user_id) listed
       JOIN user_coupon uc FORCE INDEX (idx_coupon_user_source) ON uc.coupon_id = ${sqlLiteral(couponId)} AND uc.user_id = CONVERT(listed.user_id USING utf8mb4) COLLATE utf8mb4_bin
       WHERE uc.source IN ('GRAB', 'BULK') GROUP BY uc.user_id`,
    )) as { user_id: string; n: string }[];
    for (const r of rows) held.set(r.user_id, Number(r.n));
  }
  return held;
}

/** User coupons of this coupon that took a unit of its stock. */
export async function countFromStock(em: Queryable, couponId: string): Promise<number> {
  const [{ n }] = (await em.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND from_stock = 1`, [couponId])) as {
    n: string;
  }[];
  return Number(n);
}

/**
 * Each coupon's user coupons by the status clients see (effectiveStatus: a coupon past its expiry
 * is expired, a timed-out hold released), all of them (`issued`), and those that took a unit of
 * stock (`issuedFromStock`: with the remaining stock it adds up to initStock, invariant 1; refund
 * returns and reissues not from stock are in `issued` only). A coupon with none counts zeros.
 *
 * One statement, so one snapshot. Its first part counts by stored status from the index alone
 * (idx_coupon_status_stock): computing effectiveStatus on every row read each one by primary key,
 * over 10 s for a coupon of 8 million. The other parts move the rows whose status readers see
 * otherwise: UNUSED past expiry the sweep has not reached (a range of the same index, however many
 * a FIXED validity's end leaves), and LOCKED ones (as many as the coupon's holds). The stored
 * statuses stand in the parts as literals: MariaDB's ONLY_FULL_GROUP_BY refuses a column out of GROUP BY.
 */
export async function countByStatus(em: Queryable, couponIds: readonly string[], now = new Date()): Promise<Map<string, CouponCounts>> {
  const counts = new Map(
    couponIds.map((id) => [id, { issued: 0, issuedFromStock: 0, unused: 0, locked: 0, used: 0, expired: 0, void: 0 }]),
  );
  if (couponIds.length === 0) return counts;
  const rows = (await em.query(
    `SELECT 0 AS part, uc.coupon_id AS couponId, uc.status AS stored, uc.status AS seen, COUNT(*) AS n, SUM(uc.from_stock) AS fromStock
       FROM user_coupon uc WHERE uc.coupon_id IN (?) GROUP BY 2, 3
     UNION ALL
     SELECT 1, uc.coupon_id, 'UNUSED', 'EXPIRED', COUNT(*), 0
       FROM user_coupon uc WHERE uc.coupon_id IN (?) AND uc.status = 'UNUSED' AND uc.expires_at <= ? GROUP BY 2
     UNION ALL
     SELECT 1, uc.coupon_id, 'LOCKED', ${effectiveStatusSql('uc')}, COUNT(*), 0
       FROM user_coupon uc WHERE uc.coupon_id IN (?) AND uc.status = 'LOCKED' GROUP BY 2, 4`,
    [couponIds, couponIds, now, now, now, couponIds],
  )) as { part: number | string; couponId: string; stored: UserCouponStatus; seen: UserCouponStatus; n: string; fromStock: string }[];
  for (const r of rows) {
    const c = counts.get(String(r.couponId));
    if (!c) continue;
    const n = Number(r.n);
    // Trimmed: the column's collation pads, so a status set by hand as 'EXPIRED ' groups with (and may label) the real ones.
    const [stored, seen] = [r.stored.trim().toLowerCase() as StatusCount, r.seen.trim().toLowerCase() as StatusCount];
    if (Number(r.part) === 0) {
      // A status none of the lifecycle's (set by hand: reconciliation's to find) is issued but counted under none of them.
      if (STATUS_COUNTS.has(stored)) c[stored] += n;
      c.issued += n;
      c.issuedFromStock += Number(r.fromStock);
    } else if (seen !== stored) {
      c[stored] -= n;
      c[seen] += n;
    }
  }
  return counts;
}
export type CouponCounts = Record<'issued' | 'issuedFromStock' | StatusCount, number>;
type StatusCount = Lowercase<UserCouponStatus>;
const STATUS_COUNTS = new Set<string>(USER_COUPON_STATUSES.map((s) => s.toLowerCase()));

/**
 * A user's coupons, newest first, ids below `beforeId`, at most `limit`. `status` filters by the
 * status clients see (effectiveStatus).
 */
export async function listForUser(
  em: Queryable,
  userId: string,
  q: { status?: UserCouponStatus; beforeId?: string; limit: number },
  now = new Date(),
): Promise<UserCoupon[]> {
  const where = ['uc.user_id = ?'];
  const params: unknown[] = [userId];
  if (q.status) {
    where.push(`${effectiveStatusSql('uc')} = ?`);
    params.push(now, now, q.status);
  }
  if (q.beforeId) {
    where.push('uc.id < ?');
    params.push(q.beforeId);
  }
  const rows = (await em.query(`SELECT uc.* FROM user_coupon uc WHERE ${where.join(' AND ')} ORDER BY uc.id DESC LIMIT ?`, [
    ...params,
    q.limit,
  ])) as Record<string, unknown>[];
  return rows.map(toUserCoupon);
}

/**
 * The one status write: a compare-and-set on the current status of each row. It always sets
 * updated_at (the incremental reconciliation finds changed coupons by it), and keeps used_at set
 * exactly while the status is USED (a use keeps the time it already has). Returns the rows changed.
 * Lifecycle moves come through transit(), which checks the table and logs them.
 */
export function setStatus(
  em: EntityManager,
  ids: readonly string[],
  from: UserCouponStatus,
  to: UserCouponStatus,
  at: Date,
): Promise<number> {
  return execute(
    em,
    `UPDATE user_coupon SET status = ?, used_at = IF(? = 'USED', COALESCE(used_at, ?), NULL), updated_at = ?
     WHERE id IN (${ids.map(() => '?').join(', ')}) AND status = ?`,
    [to, to, at, at, ...ids, from],
  );
}

/**
 * Locks up to `size` UNUSED coupons past their expiry, oldest expiry first. SKIP LOCKED leaves alone
 * any coupon a redemption or void holds right now; those settle it themselves.
 */
export async function lockExpired(em: Queryable, now: Date, size: number): Promise<string[]> {
  const rows = (await em.query(
    `SELECT id FROM user_coupon WHERE status = 'UNUSED' AND expires_at <= ? ORDER BY expires_at, id LIMIT ? FOR UPDATE SKIP LOCKED`,
    [now, size],
  )) as { id: string }[];
  return rows.map((r) => String(r.id));
}

/**
 * A user's coupons usable now as every reader sees them: UNUSED (a timed-out hold included), not
 * expired, already valid. One query on the (user_id, status, id) index.
 */
export async function listUsableForUser(em: Queryable, userId: string, now: Date): Promise<UserCoupon[]> {
  const rows = (await em.query(
    `SELECT * FROM user_coupon
     WHERE user_id = ? AND status IN ('UNUSED', 'LOCKED') AND (status = 'UNUSED' OR locked_until <= ?) AND expires_at > ? AND valid_from <= ?`,
    [userId, now, now, now],
  )) as Record<string, unknown>[];
  return rows.map(toUserCoupon);
}

/** Stores the expiry of the hold that locks this coupon (UserCoupon.lockedUntil), in the hold's transaction. */
export async function setLockedUntil(em: Queryable, userCouponId: string, until: Date): Promise<void> {
  await em.query(`UPDATE user_coupon SET locked_until = ? WHERE id = ?`, [until, userCouponId]);
}

/**
 * Locks up to `size` LOCKED coupons whose hold has timed out, oldest first, with their validity end.
 * SKIP LOCKED leaves alone any coupon a confirmation, release or void holds right now; those settle it.
 */
export async function lockTimedOutHolds(em: Queryable, now: Date, size: number): Promise<{ id: string; expiresAt: Date }[]> {
  const rows = (await em.query(
    `SELECT id, expires_at FROM user_coupon WHERE status = 'LOCKED' AND locked_until <= ? ORDER BY locked_until, id LIMIT ? FOR UPDATE SKIP LOCKED`,
    [now, size],
  )) as { id: string; expires_at: Date }[];
  return rows.map((r) => ({ id: String(r.id), expiresAt: r.expires_at }));
}
