import type { EntityManager, QueryRunner } from 'typeorm';
import type { HoldClosing } from '../redemption/holds.js';
import { orderUses, type OrderUses } from '../redemption/order.js';
import { explained, type Explained, sentence } from './explanations.js';

type Queryable = Pick<QueryRunner | EntityManager, 'query'>;

/** A LOCKED coupon that no ACTIVE hold references: nothing will ever confirm, release or time it out. */
export interface LockedWithoutHoldFinding {
  type: 'LOCKED_WITHOUT_HOLD';
  couponId: string;
  userCouponId: string;
  redemptionId: null;
  details: { lockedUntil: string | null; expiresAt: string; releaseTo: 'UNUSED' | 'EXPIRED' } & Explained;
  action: 'RELEASE_COUPON';
  params: { userCouponId: string };
}

/** An ACTIVE hold whose coupon is not LOCKED for it (another state, or locked for another hold). */
export interface HoldWithoutLockedFinding {
  type: 'HOLD_WITHOUT_LOCKED';
  couponId: string | null;
  userCouponId: string;
  redemptionId: string | null;
  details: { holdId: string; orderNo: string; status: string | null; closeAs: HoldClosing } & Explained;
  action: 'CLOSE_HOLD';
  params: { holdId: string; userCouponId: string; expectStatus: string | null; closeAs: HoldClosing };
}

/**
 * An ACTIVE hold whose coupon is LOCKED, by its log too, and for no other hold, but until another
 * time than the hold's end (a hand edit of `locked_until`): the hold is the live one, so the lock's
 * time is what is wrong. Closing the hold would cancel the order's checkout.
 */
export interface HoldLockUntilFinding {
  type: 'HOLD_WITHOUT_LOCKED';
  couponId: string;
  userCouponId: string;
  redemptionId: null;
  details: { holdId: string; orderNo: string; status: 'LOCKED'; lockedUntil: string | null; holdExpiresAt: string } & Explained;
  action: 'SET_LOCKED_UNTIL';
  params: { holdId: string; userCouponId: string; expectLockedUntil: string | null; lockedUntil: string };
}

/** An order whose USED redemptions take more off than the order's amount. */
export interface OrderDiscountFinding {
  type: 'ORDER_DISCOUNT_EXCEEDED';
  couponId: null;
  userCouponId: null;
  redemptionId: string;
  orderNo: string;
  details: { orderNo: string; orderAmountCents: number; discountCents: number; redemptionIds: string[] } & Explained;
  action: 'MANUAL_REVIEW';
  params: { orderNo: string; redemptionIds: string[] };
}

/** An order that holds, redemptions or refunds name whose coupon_order row is gone. */
export interface OrderRowMissingFinding {
  type: 'ORDER_ROW_MISSING';
  couponId: null;
  userCouponId: null;
  redemptionId: null;
  orderNo: string;
  details: { orderNo: string; orderAmountCents: number | null; refunded: boolean; orderCreatedAt: string } & Explained;
  action: 'RECREATE_ORDER' | 'MANUAL_REVIEW';
  /** The row as the run found it should be: approval writes it only while the order's rows still say so. */
  params: { orderNo: string; orderAmountCents: number | null; refunded: boolean; orderCreatedAt: string };
}

/**
 * An order that refunds name whose coupon_order row says it is not refunded (a hand edit, a restored
 * backup, or on a cluster a lost row put back on one node while a refund ran on another): it takes
 * new coupons, which a refunded order refuses (ORDER_REFUNDED).
 */
export interface OrderNotRefundedFinding {
  type: 'ORDER_NOT_REFUNDED';
  couponId: null;
  userCouponId: null;
  redemptionId: null;
  orderNo: string;
  details: {
    orderNo: string;
    /** Its first REFUND_IDS_SHOWN refunds by id; refundCount counts them all. */
    refundIds: string[];
    refundCount: number;
    /** When its first refund was made. */
    refundedAt: string;
    /** USED redemptions from then on, by the clocks of the instances that wrote them (within their skew). */
    redemptionIds: string[];
    /** Its ACTIVE holds not timed out, whenever made: a refund releases every one, so none should be left. */
    holdIds: string[];
  } & Explained;
  action: 'MARK_ORDER_REFUNDED';
  params: { orderNo: string };
}

/** What the audit of an order's row finds. */
export type OrderRowFinding = OrderRowMissingFinding | OrderNotRefundedFinding;

export type HoldFinding = LockedWithoutHoldFinding | HoldWithoutLockedFinding | HoldLockUntilFinding;

/** The ids a GROUP_CONCAT listed (none for NULL, which it gives for no row). */
export const idList = (list: string | null): string[] => (list === null ? [] : String(list).split(','));

/** The status the coupon `uc`'s state log ends in. */
const LAST_LOGGED = `(SELECT l.to_status FROM user_coupon_state_log l WHERE l.user_coupon_id = uc.id ORDER BY l.id DESC LIMIT 1)`;

/**
 * Invariant 6 for the user coupons with ids in [lo, hi]: LOCKED exactly when one ACTIVE hold
 * references it. A LOCKED coupon without one is proposed for release (to UNUSED, or EXPIRED past its
 * validity) when its log says LOCKED too; when the log ends elsewhere, the status is what is wrong,
 * and the log audit's LOG_MISMATCH sets it back without a move (a release would log a step from a
 * state the log never reached); an ACTIVE hold whose coupon is not LOCKED, or is LOCKED for another of its holds (the
 * first one whose expiry the coupon carries), is proposed for closing: CONFIRMED when a USED redemption of
 * the same (order, coupon) exists, else RELEASED. When the coupon is LOCKED, by its log too, but no ACTIVE
 * hold's end is its `locked_until`, the first hold is the live one and the lock's time is set back to its
 * end (SET_LOCKED_UNTIL) rather than the hold closed. A hold the coupon's log agrees with (it ends in LOCKED) and no
 * redemption confirmed is left to the log audit, which sets the status back to LOCKED: the hold is the live one.
 */
export async function holdChunk(q: Queryable, lo: bigint, hi: bigint, now: Date): Promise<HoldFinding[]> {
  const range = [String(lo), String(hi)];
  // The plain status comparison lets the status index find the few LOCKED coupons (reading the chunk's 5,000 rows again
  // took 2.8 ms a chunk; with more LOCKED coupons than that in the table the optimizer reads the chunk's rows, as before);
  // BINARY keeps a status written 'locked' out, as everywhere.
  const locked: { id: string; coupon_id: string; locked_until: Date | null; expires_at: Date }[] = await q.query(
    `SELECT uc.id, uc.coupon_id, uc.locked_until, uc.expires_at
     FROM user_coupon uc
     WHERE uc.id BETWEEN ? AND ? AND uc.status = 'LOCKED' AND BINARY uc.status = 'LOCKED'
       AND NOT EXISTS (SELECT 1 FROM redemption_hold h WHERE h.user_coupon_id = uc.id AND h.status = 'ACTIVE')
       AND BINARY ${LAST_LOGGED} = 'LOCKED'
     ORDER BY uc.id`,
    range,
  );
  const holds: {
    id: string;
    user_coupon_id: string;
    order_no: string;
    coupon_id: string | null;
    status: string | null;
    redemption_id: string | null;
    locked_until: Date | null;
    expires_at: Date;
    locked_for_it: number | null;
  }[] = await q.query(
    `SELECT h.id, h.user_coupon_id, h.order_no, uc.coupon_id, uc.status, r.id AS redemption_id, uc.locked_until, h.expires_at,
            (BINARY uc.status = 'LOCKED'
             AND NOT EXISTS (SELECT 1 FROM redemption_hold e WHERE e.user_coupon_id = h.user_coupon_id AND e.status = 'ACTIVE'
                             AND (e.expires_at <=> uc.locked_until OR e.id < h.id))
             AND BINARY ${LAST_LOGGED} <=> 'LOCKED')
              AS locked_for_it
     FROM redemption_hold h
     LEFT JOIN user_coupon uc ON uc.id = h.user_coupon_id
     LEFT JOIN redemption r ON r.order_no = h.order_no AND r.user_coupon_id = h.user_coupon_id AND r.status = 'USED'
     WHERE h.user_coupon_id BETWEEN ? AND ? AND h.status = 'ACTIVE'
       AND (uc.id IS NULL OR BINARY uc.status <> 'LOCKED' OR NOT (uc.locked_until <=> h.expires_at)
            OR EXISTS (SELECT 1 FROM redemption_hold e WHERE e.user_coupon_id = h.user_coupon_id AND e.status = 'ACTIVE'
                       AND e.expires_at <=> uc.locked_until AND e.id < h.id))
       AND NOT (r.id IS NULL AND uc.id IS NOT NULL AND BINARY uc.status <> 'LOCKED'
                AND BINARY ${LAST_LOGGED} <=> 'LOCKED')
     ORDER BY h.id`,
    range,
  );
  return [
    ...locked.map((r): LockedWithoutHoldFinding => {
      const releaseTo = r.expires_at.getTime() <= now.getTime() ? 'EXPIRED' : 'UNUSED';
      return {
        type: 'LOCKED_WITHOUT_HOLD',
        couponId: String(r.coupon_id),
        userCouponId: String(r.id),
        redemptionId: null,
        details: {
          lockedUntil: r.locked_until?.toISOString() ?? null,
          expiresAt: r.expires_at.toISOString(),
          releaseTo,
          ...explained(sentence('LOCKED_WITHOUT_HOLD', { releaseTo })),
        },
        action: 'RELEASE_COUPON',
        params: { userCouponId: String(r.id) },
      };
    }),
    ...holds.map((h): HoldWithoutLockedFinding | HoldLockUntilFinding => {
      if (Number(h.locked_for_it) === 1 && h.redemption_id === null) return lockUntilFinding(h as typeof h & { coupon_id: string });
      const closeAs = h.redemption_id === null ? 'RELEASED' : 'CONFIRMED';
      return {
        type: 'HOLD_WITHOUT_LOCKED',
        couponId: h.coupon_id === null ? null : String(h.coupon_id),
        userCouponId: String(h.user_coupon_id),
        redemptionId: h.redemption_id === null ? null : String(h.redemption_id),
        details: {
          holdId: String(h.id),
          orderNo: h.order_no,
          status: h.status,
          closeAs,
          ...explained(
            h.redemption_id !== null
              ? sentence('HOLD_ORDER_USED_COUPON', { redemptionId: String(h.redemption_id) })
              : h.status === null
                ? sentence('HOLD_COUPON_GONE')
                : h.status === 'LOCKED'
                  ? sentence('HOLD_COUPON_LOCKED_FOR_ANOTHER')
                  : sentence('HOLD_COUPON_NOT_LOCKED', { status: h.status }),
          ),
        },
        action: 'CLOSE_HOLD',
        params: { holdId: String(h.id), userCouponId: String(h.user_coupon_id), expectStatus: h.status, closeAs },
      };
    }),
  ];
}

/** The first ACTIVE hold of a LOCKED coupon that no hold's end matches: its end is the lock's. */
function lockUntilFinding(h: {
  id: string;
  user_coupon_id: string;
  order_no: string;
  coupon_id: string;
  locked_until: Date | null;
  expires_at: Date;
}): HoldLockUntilFinding {
  const lockedUntil = h.locked_until?.toISOString() ?? null;
  const holdExpiresAt = h.expires_at.toISOString();
  return {
    type: 'HOLD_WITHOUT_LOCKED',
    couponId: String(h.coupon_id),
    userCouponId: String(h.user_coupon_id),
    redemptionId: null,
    details: {
      holdId: String(h.id),
      orderNo: h.order_no,
      status: 'LOCKED',
      lockedUntil,
      holdExpiresAt,
      ...explained(sentence('HOLD_LOCK_UNTIL_WRONG', { lockedUntil: lockedUntil ?? 'NULL', holdExpiresAt })),
    },
    action: 'SET_LOCKED_UNTIL',
    params: { holdId: String(h.id), userCouponId: String(h.user_coupon_id), expectLockedUntil: lockedUntil, lockedUntil: holdExpiresAt },
  };
}

/**
 * The orders of the redemptions with ids in [lo, hi] that lost their coupon_order row
 * (ORDER_ROW_MISSING), and those whose USED redemptions add up to more than the order's amount, the
 * smaller of its recorded amount and the amounts its redemptions named (ORDER_DISCOUNT_EXCEEDED: only
 * an operator can decide about money already taken off, so the proposal is a review). One statement
 * per chunk of the ids the run reads anyway finds the suspects: a use above what its order allows
 * alone, or beside another use of its order (one dive into the order_no index); only their orders
 * are summed. An order of several uses is reported by the chunk of its first. Summing every order in
 * order_no chunks instead took 20 s for 2,500,000 orders, one chunk at a time (BENCHMARKS.md).
 */
export async function orderChunk(q: Queryable, lo: bigint, hi: bigint, now: Date): Promise<(OrderRowFinding | OrderDiscountFinding)[]> {
  const suspects: { order_no: string; lost: number | string }[] = await q.query(
    `SELECT DISTINCT x.order_no, o.order_no IS NULL AS lost
     FROM redemption x LEFT JOIN coupon_order o ON o.order_no = x.order_no
     WHERE x.id BETWEEN ? AND ?
       AND (o.order_no IS NULL
            OR x.status = 'USED' AND (x.discount_cents > LEAST(o.order_amount_cents, x.order_amount_cents)
                                      OR EXISTS (SELECT 1 FROM redemption y WHERE y.order_no = x.order_no AND y.id <> x.id)))`,
    [String(lo), String(hi)],
  );
  const lost = suspects.filter((s) => Number(s.lost) === 1).map((s) => s.order_no);
  const summed = suspects.filter((s) => Number(s.lost) === 0).map((s) => s.order_no);
  return [...(await orderRowFindings(q, lost, now)), ...(summed.length === 0 ? [] : await discountFindings(q, summed, lo, hi))];
}

async function discountFindings(q: Queryable, orderNos: string[], lo: bigint, hi: bigint): Promise<OrderDiscountFinding[]> {
  const sums: { order_no: string; amount: string; discounts: string; ids: string }[] = await q.query(
    `SELECT r.order_no, LEAST(o.order_amount_cents, MIN(r.order_amount_cents)) AS amount, SUM(r.discount_cents) AS discounts,
            GROUP_CONCAT(r.id ORDER BY r.id) AS ids
     FROM redemption r JOIN coupon_order o ON o.order_no = r.order_no
     WHERE r.order_no IN (?) AND r.status = 'USED'
     GROUP BY r.order_no, o.order_amount_cents
     HAVING SUM(r.discount_cents) > LEAST(o.order_amount_cents, MIN(r.order_amount_cents)) AND MIN(r.id) BETWEEN ? AND ?
     ORDER BY r.order_no`,
    [orderNos, String(lo), String(hi)],
  );
  return sums.map((s): OrderDiscountFinding => {
    const redemptionIds = idList(s.ids);
    return {
      type: 'ORDER_DISCOUNT_EXCEEDED',
      couponId: null,
      userCouponId: null,
      redemptionId: redemptionIds[0],
      orderNo: s.order_no,
      details: {
        orderNo: s.order_no,
        orderAmountCents: Number(s.amount),
        discountCents: Number(s.discounts),
        redemptionIds,
        ...explained(
          sentence('ORDER_DISCOUNT_EXCEEDED', {
            orderNo: s.order_no,
            discountCents: Number(s.discounts),
            orderAmountCents: Number(s.amount),
          }),
        ),
      },
      action: 'MANUAL_REVIEW',
      params: { orderNo: s.order_no, redemptionIds },
    };
  });
}

/** The tables besides redemption (orderChunk) whose rows name an order. */
export type OrderNaming = 'redemption_hold' | 'refund';

/**
 * Orders named by rows of `table` with ids in [lo, hi] whose coupon_order row is gone (deleted by
 * hand, lost): the discount audit never sees their uses, and their next coupon would write the row
 * again with its own amount. Refunds also name the orders whose row says they are not refunded
 * (ORDER_NOT_REFUNDED). One anti-join on primary keys per chunk of ids. An order of several refunds
 * in several chunks is found by each, as a lost order is by each table naming it: the run records
 * it once, under its open key.
 */
export async function orderRowChunk(q: Queryable, table: OrderNaming, lo: bigint, hi: bigint, now: Date): Promise<OrderRowFinding[]> {
  const suspect = table === 'refund' ? 'o.order_no IS NULL OR o.refunded = 0' : 'o.order_no IS NULL';
  const suspects: { order_no: string }[] = await q.query(
    `SELECT DISTINCT x.order_no FROM ${table} x LEFT JOIN coupon_order o ON o.order_no = x.order_no
     WHERE x.id BETWEEN ? AND ? AND (${suspect})`,
    [String(lo), String(hi)],
  );
  return orderRowFindings(
    q,
    suspects.map((s) => s.order_no),
    now,
  );
}

/** The suspect orders, usually none, audited one by one. */
async function orderRowFindings(q: Queryable, orderNos: string[], now: Date): Promise<OrderRowFinding[]> {
  const findings: OrderRowFinding[] = [];
  for (const orderNo of orderNos) findings.push(...(await orderRowAudit(q, orderNo, now)));
  return findings;
}

/**
 * The audit of one order's row, as it sees it now: ORDER_ROW_MISSING when the row is gone and
 * something names the order, ORDER_NOT_REFUNDED when it says not refunded and a refund names the
 * order, else none.
 */
export async function orderRowAudit(q: Queryable, orderNo: string, now: Date): Promise<OrderRowFinding[]> {
  const [row]: { refunded: number }[] = await q.query(`SELECT refunded FROM coupon_order WHERE order_no = ?`, [orderNo]);
  if (row) return Number(row.refunded) === 1 ? [] : notRefundedAudit(q, orderNo, now);
  const uses = await orderUses(q, orderNo, now);
  return uses ? [orderRowFinding(uses)] : [];
}

/** A finding about an order's row names no coupon, user coupon or redemption of its own. */
const aboutOrder = (orderNo: string) => ({ couponId: null, userCouponId: null, redemptionId: null, orderNo });

/** How many of an order's refunds its ORDER_NOT_REFUNDED names: an order has one per coupon it carried, a few. */
const REFUND_IDS_SHOWN = 10;

/**
 * ORDER_NOT_REFUNDED for an order whose row says not refunded, when a refund names it; with the
 * coupons it took in redemptions from its first refund on, which a refunded order would have refused
 * (the operator must know of them), and the coupons still held for it (approval releases them, as a
 * refund does; a hold whose coupon is not LOCKED, or is held by another ACTIVE hold too, is a
 * HOLD_WITHOUT_LOCKED of its own, left to that). Timed-out holds are not counted: to every reader
 * they are released already (approval stores them so, as TIMEOUT).
 * Reads the (order_no, ...) keys of the three tables.
 */
async function notRefundedAudit(q: Queryable, orderNo: string, now: Date): Promise<OrderNotRefundedFinding[]> {
  const [f]: { n: string; at: Date | null; ids: string | null; redemptions: string | null; holds: string | null }[] = await q.query(
    `SELECT f.n, f.at, f.ids,
            (SELECT GROUP_CONCAT(r.id ORDER BY r.id) FROM redemption r
             WHERE r.order_no = ? AND BINARY r.status = 'USED' AND r.used_at >= f.at) AS redemptions,
            (SELECT GROUP_CONCAT(h.id ORDER BY h.id) FROM redemption_hold h
             JOIN user_coupon uc ON uc.id = h.user_coupon_id AND BINARY uc.status = 'LOCKED'
             WHERE h.order_no = ? AND BINARY h.status = 'ACTIVE' AND h.expires_at > ?
               AND NOT EXISTS (SELECT 1 FROM redemption_hold o
                               WHERE o.user_coupon_id = h.user_coupon_id AND o.status = 'ACTIVE' AND o.id <> h.id)) AS holds
     FROM (SELECT COUNT(*) AS n, MIN(created_at) AS at, SUBSTRING_INDEX(GROUP_CONCAT(id ORDER BY id), ',', ${REFUND_IDS_SHOWN}) AS ids
           FROM refund WHERE order_no = ?) f`,
    [orderNo, orderNo, now, orderNo],
  );
  if (Number(f.n) === 0) return [];
  const [redemptionIds, holdIds] = [idList(f.redemptions), idList(f.holds)];
  const refundedAt = (f.at as Date).toISOString();
  const refundCount = Number(f.n);
  return [
    {
      type: 'ORDER_NOT_REFUNDED',
      ...aboutOrder(orderNo),
      details: {
        orderNo,
        refundIds: idList(f.ids),
        refundCount,
        refundedAt,
        redemptionIds,
        holdIds,
        ...explained(
          sentence('ORDER_NOT_REFUNDED', { orderNo, refundCount, refundedAt }),
          sentence('MARK_ORDER_REFUNDED'),
          ...(redemptionIds.length === 0 ? [] : [sentence('TAKEN_AFTER_REFUND', { redemptionCount: redemptionIds.length })]),
          ...(holdIds.length === 0 ? [] : [sentence('HOLDS_RELEASED_WITH_MARK', { holdCount: holdIds.length })]),
        ),
      },
      action: 'MARK_ORDER_REFUNDED',
      params: { orderNo },
    },
  ];
}

/** The row comes back from what names the order; with only refunds left, no amount does, so an operator decides. */
function orderRowFinding(uses: OrderUses): OrderRowMissingFinding {
  const { orderNo, orderAmountCents, refunded } = uses;
  return {
    type: 'ORDER_ROW_MISSING',
    ...aboutOrder(orderNo),
    details: {
      orderNo,
      orderAmountCents,
      refunded,
      orderCreatedAt: uses.createdAt.toISOString(),
      ...explained(
        sentence('ORDER_ROW_MISSING', { orderNo }),
        orderAmountCents === null ? sentence('ORDER_AMOUNT_UNKNOWN') : sentence('RECREATE_ORDER_ROW', { orderAmountCents }),
      ),
    },
    action: orderAmountCents === null ? 'MANUAL_REVIEW' : 'RECREATE_ORDER',
    params: { orderNo, orderAmountCents, refunded, orderCreatedAt: uses.createdAt.toISOString() },
  };
}
