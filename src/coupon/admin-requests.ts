import { createHash } from 'node:crypto';
import stringify from 'safe-stable-stringify';
import type { EntityManager } from 'typeorm';

type Queryable = Pick<EntityManager, 'query'>;

/** Operators' writes made idempotent by an optional Idempotency-Key (admin_request). */
export type AdminOperation = 'coupon.create' | 'coupon.stock';

/** The request as a digest: its fields in a fixed order, so a retry that orders its JSON otherwise is the same request. */
export const requestDigest = (request: unknown): string =>
  createHash('sha256')
    .update(stringify(request) ?? '')
    .digest('hex');

/**
 * Records the key first in the caller's transaction: a repeat's INSERT waits on this row until the
 * first commits, then fails as a duplicate (or goes on, if the first rolled back). The coupon is
 * set once known (a new coupon's id comes after this).
 */
export async function recordAdminRequest(
  em: Queryable,
  operation: AdminOperation,
  key: string,
  digest: string,
  couponId: string | null,
  at: Date,
): Promise<void> {
  await em.query(`INSERT INTO admin_request (operation, idempotency_key, request_digest, coupon_id, created_at) VALUES (?, ?, ?, ?, ?)`, [
    operation,
    key,
    digest,
    couponId,
    at,
  ]);
}

export async function setAdminRequestCoupon(em: Queryable, operation: AdminOperation, key: string, couponId: string): Promise<void> {
  await em.query(`UPDATE admin_request SET coupon_id = ? WHERE operation = ? AND idempotency_key = ?`, [couponId, operation, key]);
}

export async function findAdminRequest(
  em: Queryable,
  operation: AdminOperation,
  key: string,
): Promise<{ digest: string; couponId: string | null } | null> {
  const [row] = (await em.query(`SELECT request_digest, coupon_id FROM admin_request WHERE operation = ? AND idempotency_key = ?`, [
    operation,
    key,
  ])) as { request_digest: string; coupon_id: string | number }[];
  return row ? { digest: row.request_digest, couponId: row.coupon_id === null ? null : String(row.coupon_id) } : null;
}
