import type { EntityManager, QueryRunner } from 'typeorm';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { execute } from '../database/transaction.service.js';
import type { Coupon } from '../coupon/coupon.entity.js';

export interface OrderRow {
  orderNo: string;
  orderAmountCents: number;
  refunded: boolean;
}

/** Rows of coupon_order_lock, filled by the OrderLockStripes migration. */
export const ORDER_LOCK_STRIPES = 1024;

/** The stripe row an order's requests lock first; `?` is the order number. */
const STRIPE_OF_ORDER = `stripe = CRC32(?) % ${ORDER_LOCK_STRIPES}`;

/**
 * Locks the order: first its stripe row, which always exists, then its own row, creating it with
 * this amount when this is the order's first coupon. Every hold, redemption and refund of an order
 * takes this lock before the user coupon's, so two coupons racing onto one order are decided one
 * after the other, each seeing what the other committed. The order's own row cannot be the first
 * lock: its first requests create it, and waiters on a row whose inserter rolled back deadlock on
 * inserting it again (see the OrderLockStripes migration). Orders sharing a stripe wait for each
 * other only for the length of one transaction. Inside the caller's transaction: a refusal rolls
 * the new row back with everything else.
 */
export async function lockOrder(em: EntityManager, orderNo: string, orderAmountCents: number, now: Date): Promise<OrderRow> {
  // One statement locks both: the stripe is read (and locked) first, the order's row after it. With
  // no row, whether a refund names the order: its row was lost (reconciliation's ORDER_ROW_MISSING),
  // and written again as not refunded, the refunded order would take new coupons.
  const [locked] = (await em.query(
    `SELECT o.order_amount_cents, o.refunded, o.order_no IS NULL AND EXISTS (SELECT 1 FROM refund f WHERE f.order_no = ?) AS refunds
     FROM coupon_order_lock s LEFT JOIN coupon_order o ON o.order_no = ?
     WHERE s.${STRIPE_OF_ORDER} FOR UPDATE`,
    [orderNo, orderNo, orderNo],
  )) as ((StoredOrder & { refunds: number }) | { order_amount_cents: null; refunded: null; refunds: number })[];
  const refunded = Number(locked.refunds) === 1;
  if (locked.order_amount_cents === null && (await insertOrder(em, { orderNo, orderAmountCents, refunded, createdAt: now }))) {
    return { orderNo, orderAmountCents, refunded };
  }
  // A write, for a cluster: row locks are local to a node, and only writes are certified across nodes.
  await em.query(`UPDATE coupon_order SET lock_version = lock_version + 1 WHERE order_no = ?`, [orderNo]);
  const row =
    locked.order_amount_cents !== null
      ? locked
      : ((await em.query(`SELECT order_amount_cents, refunded FROM coupon_order WHERE order_no = ?`, [orderNo])) as StoredOrder[])[0];
  return { orderNo, orderAmountCents: Number(row.order_amount_cents), refunded: Boolean(row.refunded) };
}

interface StoredOrder {
  order_amount_cents: string;
  refunded: number;
}

/**
 * Writes the order's row; false when it is there already: another node of a cluster made it (a
 * stripe lock is local to its node), or, for a lost row put back, anyone since the run that found it.
 */
export async function insertOrder(em: EntityManager, row: OrderRow & { createdAt: Date }): Promise<boolean> {
  try {
    await em.query(`INSERT INTO coupon_order (order_no, order_amount_cents, refunded, created_at) VALUES (?, ?, ?, ?)`, [
      row.orderNo,
      row.orderAmountCents,
      row.refunded ? 1 : 0,
      row.createdAt,
    ]);
    return true;
  } catch (err) {
    if (isDuplicateKey(err)) return false;
    throw err;
  }
}

/** What an order's holds, redemptions and refunds say of it; the amount is null when only refunds name it (a refund keeps none). */
export interface OrderUses {
  orderNo: string;
  orderAmountCents: number | null;
  refunded: boolean;
  createdAt: Date;
}

/**
 * The row an order's holds, redemptions and refunds say it had, for one whose coupon_order row was
 * lost; null when none names the order. The amount is the smallest its live coupons (USED
 * redemptions, ACTIVE holds not timed out) named, as the order audit takes it; with none live, the
 * smallest any named (the order's next coupon sets its own then, see orderDiscount). Refunded when a
 * refund names it; created with its first row. Reads the (order_no, ...) keys of each table.
 */
export async function orderUses(q: Pick<QueryRunner | EntityManager, 'query'>, orderNo: string, now: Date): Promise<OrderUses | null> {
  const [row] = (await q.query(
    `SELECT COUNT(*) AS n, COALESCE(MIN(CASE WHEN x.live THEN x.amount END), MIN(x.amount)) AS amount, MAX(x.refund) AS refunded,
            MIN(x.at) AS created_at
     FROM (
       SELECT order_amount_cents AS amount, BINARY status = 'USED' AS live, 0 AS refund, used_at AS at FROM redemption WHERE order_no = ?
       UNION ALL
       SELECT order_amount_cents, BINARY status = 'ACTIVE' AND expires_at > ?, 0, created_at FROM redemption_hold WHERE order_no = ?
       UNION ALL
       SELECT NULL, 0, 1, created_at FROM refund WHERE order_no = ?
     ) x`,
    [orderNo, now, orderNo, orderNo],
  )) as { n: string; amount: string | null; refunded: string | null; created_at: Date | null }[];
  if (Number(row.n) === 0) return null;
  return {
    orderNo,
    orderAmountCents: row.amount === null ? null : Number(row.amount),
    refunded: Number(row.refunded) === 1,
    createdAt: row.created_at as Date,
  };
}

/**
 * The order's lock without its row, for a request that adds no coupon to it: it waits for every
 * hold, redemption and refund of the order in progress, and they for it.
 */
export async function lockOrderStripe(em: EntityManager, orderNo: string): Promise<void> {
  await em.query(`SELECT stripe FROM coupon_order_lock WHERE ${STRIPE_OF_ORDER} FOR UPDATE`, [orderNo]);
}

/** A refund marks its order, under the order's lock: from then on it takes no new hold or redemption. */
export async function markOrderRefunded(em: EntityManager, orderNo: string): Promise<void> {
  await lockOrderStripe(em, orderNo);
  await setOrderRefunded(em, orderNo);
}

/**
 * The order's row says refunded, for a caller that holds the order's lock already (a refund, or
 * reconciliation marking an order its refunds name); false when the order has no row.
 */
export async function setOrderRefunded(em: EntityManager, orderNo: string): Promise<boolean> {
  return (await execute(em, `UPDATE coupon_order SET refunded = 1 WHERE order_no = ?`, [orderNo])) === 1;
}

export function refuseRefundedOrder(order: OrderRow): void {
  if (order.refunded) throw new AppError('ORDER_REFUNDED', `Order ${order.orderNo} was refunded and takes no new coupon`);
}

/**
 * The order rules for adding user coupon `uc` (of template `coupon`) to a locked order: not refunded,
 * at most one coupon unless all of them are stackable, stacked ones naming the same amount, and
 * stacked discounts never beyond the order's amount. Answers the discount granted: `discountCents`,
 * cut down to what the other coupons leave of the order. A refusal names the order's coupons and
 * amount only as far as they are this user's: an order number is no secret, another customer's
 * coupons and cart are.
 */
export async function orderDiscount(
  em: EntityManager,
  order: OrderRow,
  orderAmountCents: number,
  uc: { id: string; userId: string },
  coupon: Pick<Coupon, 'stackable'>,
  discountCents: number,
  now: Date,
): Promise<number> {
  refuseRefundedOrder(order);
  // Timed-out holds count as released, as everywhere; a confirmed hold is counted by its redemption.
  const others = (await em.query(
    `SELECT x.user_coupon_id, x.discount_cents, c.stackable, uc.user_id
     FROM (
       SELECT user_coupon_id, discount_cents FROM redemption_hold WHERE order_no = ? AND status = 'ACTIVE' AND expires_at > ?
       UNION ALL
       SELECT user_coupon_id, discount_cents FROM redemption WHERE order_no = ? AND status = 'USED'
     ) x
     JOIN user_coupon uc ON uc.id = x.user_coupon_id JOIN coupon c ON c.id = uc.coupon_id
     WHERE x.user_coupon_id <> ?`,
    [order.orderNo, now, order.orderNo, uc.id],
  )) as { user_coupon_id: string; discount_cents: string; stackable: number; user_id: string }[];
  if (others.length === 0) {
    // Nothing on the order any more (its holds released or timed out): the cart may have changed
    // since, so the order takes this amount.
    if (orderAmountCents !== order.orderAmountCents) {
      await em.query(`UPDATE coupon_order SET order_amount_cents = ? WHERE order_no = ?`, [orderAmountCents, order.orderNo]);
    }
    return discountCents;
  }
  const onOrder = others.filter((o) => o.user_id === uc.userId).map((o) => String(o.user_coupon_id));
  const foreign = onOrder.length < others.length;
  if (!coupon.stackable || others.some((o) => !o.stackable)) {
    throw new AppError('ORDER_HAS_COUPON', `Order ${order.orderNo} already carries a coupon`, { userCouponIds: onOrder });
  }
  if (orderAmountCents !== order.orderAmountCents) {
    throw foreign
      ? new AppError('ORDER_AMOUNT_MISMATCH', `Order ${order.orderNo} was priced at another amount`)
      : new AppError('ORDER_AMOUNT_MISMATCH', `Order ${order.orderNo} was priced at ${order.orderAmountCents} cents`, {
          orderAmountCents: order.orderAmountCents,
        });
  }
  const room = order.orderAmountCents - others.reduce((sum, o) => sum + Number(o.discount_cents), 0);
  if (room <= 0) {
    throw new AppError('ORDER_HAS_COUPON', `The coupons on order ${order.orderNo} already take its whole amount off`, {
      userCouponIds: onOrder,
    });
  }
  return Math.min(discountCents, room);
}
