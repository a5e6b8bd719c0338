/**
 * The sentences a discrepancy's `details.explanation` is made of, each written once, here: in
 * English, under a stable key, from the values it names. The finding carries the English text in
 * `explanation` and, beside it, `explanationParts`: each sentence's key and values, from which a
 * client says the same in its own language (the console does, in English and Chinese, and shows the
 * English text for a key it does not know). A key keeps its meaning and its parameters once
 * released: a sentence that says something else is a new key. Parameters are strings and numbers.
 */
/** An amount in cents as the console shows one (¥150, ¥12.50); anything else as it is. */
const yuan = (cents: number | string) => (typeof cents === 'number' ? `¥${(cents / 100).toFixed(cents % 100 === 0 ? 0 : 2)}` : cents);

const SENTENCES = {
  // stock (invariant 1)
  STOCK_UNITS_LOST: (p: { count: number }) => `${p.count} unit(s) left the stock without an issued coupon: put them back.`,
  STOCK_UNITS_EXCESS: (p: { count: number }) => `${p.count} unit(s) more than the initial stock exist: take them off the remaining stock.`,
  STOCK_OVER_ISSUED: (p: { issuedFromStock: number; initStock: number; stock: number }) =>
    `${p.issuedFromStock} coupons were issued from stock, more than the initial ${p.initStock}, and ${p.stock} remain: ` +
    `end the sale at what was issued (initial stock ${p.issuedFromStock}, none remaining).`,
  STOCK_ROW_MISSING: (p: { issuedFromStock: number }) =>
    `The coupon has no stock row: recreate it sold out (initial stock = the ${p.issuedFromStock} issued, none remaining); add stock afterwards if the sale goes on.`,
  // a user coupon, its log and its redemptions (invariants 4 and 5)
  USED_BY_ORDER: () => 'A USED redemption references this coupon: an order used it.',
  USE_LOGGED_REDEMPTION_MISSING: (p: { txId: string; logId: string }) =>
    `The log records its use (${p.txId}, log row ${p.logId}) but the redemption row is missing: recreate it from the log.`,
  USED_WITHOUT_USE: (p: { targetStatus: string }) =>
    `USED with no redemption and no use by an order in the log: the status goes back to ${p.targetStatus}, where the log left it.`,
  STATUS_NOT_IN_LIFECYCLE: (p: { status: string; targetStatus: string }) =>
    `${p.status} is not a status of the lifecycle: the status goes back to ${p.targetStatus}, where the log left it.`,
  LOCKED_BY_LIVE_HOLD: (p: { orderNo: string }) =>
    `The log ends LOCKED and an ACTIVE hold (order ${p.orderNo}) holds it: the status goes back to LOCKED.`,
  EXPIRED_TOO_EARLY: (p: { targetStatus: string }) =>
    `EXPIRED before its expiry, and the log never got there: the status goes back to ${p.targetStatus}, where the log left it.`,
  LOG_STATUS_CANNOT_FOLLOW: (p: { replayedStatus: string; status: string }) =>
    `The complete, legal log ends at ${p.replayedStatus}, from which ${p.status} cannot follow: the status goes back to ${p.replayedStatus}.`,
  STATUS_STANDS: (p: { status: string }) => `The status ${p.status} stands; the log is repaired to lead to it.`,
  /** Follows a sentence that sent the status back to LOCKED. */
  NO_HOLD_BACK_TO_UNUSED: () => 'No ACTIVE hold holds it, so it goes back to UNUSED.',
  /** Follows USE_LOGGED_REDEMPTION_MISSING. */
  REDEMPTION_ROW_RESTORED: (p: { redemptionId: string; redemptionStatus: string }) =>
    `Its row (${p.redemptionId}) is there with the status ${p.redemptionStatus}: it goes back to USED.`,
  USED_MORE_THAN_ONCE: (p: { count: number; orderNos: string }) =>
    `${p.count} USED redemptions (orders ${p.orderNos}) reference this one coupon: it was used more than once. Which use stands is for an operator to decide.`,
  REDEMPTION_COUPON_GONE: () =>
    'The redemption references a user coupon row that no longer exists; its template cannot be told from the tables, so an operator decides.',
  // holds (invariant 6)
  LOCKED_WITHOUT_HOLD: (p: { releaseTo: string }) =>
    `LOCKED but no ACTIVE hold references it: release it to ${p.releaseTo} through the state machine.`,
  HOLD_ORDER_USED_COUPON: (p: { redemptionId: string }) =>
    `ACTIVE, but the order used the coupon (redemption ${p.redemptionId}): close the hold as CONFIRMED.`,
  HOLD_COUPON_NOT_LOCKED: (p: { status: string }) => `ACTIVE, but its coupon is ${p.status}: close the hold as RELEASED (RECONCILIATION).`,
  HOLD_COUPON_LOCKED_FOR_ANOTHER: () => 'ACTIVE, but its coupon is LOCKED for another hold: close the hold as RELEASED (RECONCILIATION).',
  HOLD_COUPON_GONE: () => 'ACTIVE, but its coupon is gone: close the hold as RELEASED (RECONCILIATION).',
  HOLD_LOCK_UNTIL_WRONG: (p: { lockedUntil: string; holdExpiresAt: string }) =>
    `ACTIVE, and its coupon is LOCKED for no other hold, but locked until ${p.lockedUntil} where the hold ends at ${p.holdExpiresAt}: set the coupon's lock back to the hold's end.`,
  // a user's coupons of one template (invariant 2)
  USER_LIMIT_EXCEEDED: (p: { userId: string; held: number; perUserLimit: number; userCouponIds: string }) =>
    `User ${p.userId} holds ${p.held} coupons of this template from grabs and bulk issuance (${p.userCouponIds}), more than its limit of ${p.perUserLimit}: an operator decides which the user should not have.`,
  // refunds
  REFUND_REPLACEMENT_MISSING: (p: { refundNo: string; missingUserCouponId: string; userId: string }) =>
    `Refund ${p.refundNo} returned the coupon to user ${p.userId} as user coupon ${p.missingUserCouponId}, whose row is gone.`,
  /** Follows REFUND_REPLACEMENT_MISSING. */
  RETURN_AGAIN: () => 'Issue the user the returned coupon again, as the refund did.',
  REFUND_REDEMPTION_MISSING: (p: { refundNo: string; missingRedemptionId: string; redemptionId: string }) =>
    `Refund ${p.refundNo} names redemption ${p.missingRedemptionId}, which is gone; the order's use of the coupon is redemption ${p.redemptionId} (recreated under a new id): another refund number would refund it again.`,
  /** Follows REFUND_REDEMPTION_MISSING. */
  REPOINT_REFUND: () => 'Make the refund name that redemption.',
  /** Follows REFUND_REDEMPTION_MISSING. */
  REFUNDED_TWICE: (p: { otherRefundNo: string }) =>
    `Refund ${p.otherRefundNo} already names it: the use was refunded twice, which an operator decides.`,
  /** Follows REFUND_REPLACEMENT_MISSING. */
  REPLACEMENT_HAD_HISTORY: () =>
    'Its log, a redemption, a refund or a coupon replacing it shows it was used or moved on before it was lost: another coupon could give the user a second use, so an operator decides.',
  // redemptions
  REDEMPTION_DISCOUNT_EXCEEDED: (p: { orderNo: string; orderAmountCents: number; discountCents: number; ruleDiscountCents: number }) =>
    `Used on order ${p.orderNo}, it took ${yuan(p.discountCents)} off an order of ${yuan(p.orderAmountCents)}, where its template's rule takes ${yuan(p.ruleDiscountCents)} off: an operator decides.`,
  // orders
  ORDER_DISCOUNT_EXCEEDED: (p: { orderNo: string; discountCents: number; orderAmountCents: number }) =>
    `The coupons used on order ${p.orderNo} took ${yuan(p.discountCents)} off an order of ${yuan(p.orderAmountCents)}: an operator decides.`,
  ORDER_ROW_MISSING: (p: { orderNo: string }) =>
    `Holds, redemptions or refunds name order ${p.orderNo}, whose order row is gone: the order audit cannot check its discounts, and its next coupon would write the row again with that coupon's amount, as not refunded.`,
  /** Follows ORDER_ROW_MISSING. */
  RECREATE_ORDER_ROW: (p: { orderAmountCents: number }) =>
    `Put the row back: an order of ${yuan(p.orderAmountCents)} (the smallest amount its coupons named), refunded if a refund names it, created with its first hold, redemption or refund.`,
  /** Follows ORDER_ROW_MISSING. */
  ORDER_AMOUNT_UNKNOWN: () =>
    'Only refunds name it, and a refund keeps no amount: an operator decides (once its lost redemption is recreated, the next run proposes the row).',
  ORDER_NOT_REFUNDED: (p: { orderNo: string; refundCount: number; refundedAt: string }) =>
    `${p.refundCount} refund(s) name order ${p.orderNo}, the first made at ${p.refundedAt}, but its order row says it is not refunded: it takes new coupons, which a refunded order refuses.`,
  /** Follows ORDER_NOT_REFUNDED. */
  MARK_ORDER_REFUNDED: () => 'Mark the order refunded, as its refunds did: from then on it takes no new coupon.',
  /** Follows MARK_ORDER_REFUNDED, when the order took coupons in redemptions from its first refund on. */
  TAKEN_AFTER_REFUND: (p: { redemptionCount: number }) =>
    `From its first refund on it took ${p.redemptionCount} coupon(s) in redemptions: discounts a refunded order should not have had. Approval leaves them as they are: an operator decides.`,
  /** Follows MARK_ORDER_REFUNDED, when coupons are held for the order. */
  HOLDS_RELEASED_WITH_MARK: (p: { holdCount: number }) =>
    `${p.holdCount} coupon(s) are held for it: approval releases them, as a refund does.`,
} satisfies Record<string, (p: never) => string>;

export type ExplanationKey = keyof typeof SENTENCES;
export const EXPLANATION_KEYS = Object.keys(SENTENCES) as ExplanationKey[];

export type ExplanationParams = Record<string, string | number>;

/** One sentence of an explanation: its key and the values it names. */
export interface ExplanationPart {
  key: ExplanationKey;
  params: ExplanationParams;
}

/** The sentence `key` says with `params`, for `explained` to put together. */
export function sentence<K extends ExplanationKey>(key: K, ...params: Parameters<(typeof SENTENCES)[K]>): ExplanationPart {
  return { key, params: (params[0] ?? {}) as ExplanationParams };
}

/** The English text of one sentence. */
export function englishOf(part: ExplanationPart): string {
  return (SENTENCES[part.key] as (p: ExplanationParams) => string)(part.params);
}

/** What a finding's details carry about why: the English text, and the sentences it was made of. */
export interface Explained {
  explanation: string;
  explanationParts: ExplanationPart[];
}

export function explained(...parts: ExplanationPart[]): Explained {
  return { explanation: parts.map(englishOf).join(' '), explanationParts: parts };
}
