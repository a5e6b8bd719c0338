/**
 * The sentences of a discrepancy's explanation, by the key the server sends in
 * `details.explanationParts` (src/reconciliation/explanations.ts writes the English ones), with the
 * values it sends in `{braces}`. Part of the dictionaries in i18n.tsx; kept apart, without imports, so
 * that test/explanations-i18n.spec.ts can check that every key the server has is here in both languages.
 */
export const EXPLANATIONS_EN = {
  explain_STOCK_UNITS_LOST: '{count} unit(s) left the stock without an issued coupon: put them back.',
  explain_STOCK_UNITS_EXCESS: '{count} unit(s) more than the initial stock exist: take them off the remaining stock.',
  explain_STOCK_OVER_ISSUED:
    '{issuedFromStock} coupons were issued from stock, more than the initial {initStock}, and {stock} remain: end the sale at what was issued (initial stock {issuedFromStock}, none remaining).',
  explain_STOCK_ROW_MISSING:
    'The coupon has no stock row: recreate it sold out (initial stock = the {issuedFromStock} issued, none remaining); add stock afterwards if the sale goes on.',
  explain_USED_BY_ORDER: 'A USED redemption references this coupon: an order used it.',
  explain_USE_LOGGED_REDEMPTION_MISSING:
    'The log records its use ({txId}, log row {logId}) but the redemption row is missing: recreate it from the log.',
  explain_USED_WITHOUT_USE:
    'USED with no redemption and no use by an order in the log: the status goes back to {targetStatus}, where the log left it.',
  explain_STATUS_NOT_IN_LIFECYCLE:
    '{status} is not a status of the lifecycle: the status goes back to {targetStatus}, where the log left it.',
  explain_LOCKED_BY_LIVE_HOLD: 'The log ends LOCKED and an ACTIVE hold (order {orderNo}) holds it: the status goes back to LOCKED.',
  explain_EXPIRED_TOO_EARLY:
    'EXPIRED before its expiry, and the log never got there: the status goes back to {targetStatus}, where the log left it.',
  explain_LOG_STATUS_CANNOT_FOLLOW:
    'The complete, legal log ends at {replayedStatus}, from which {status} cannot follow: the status goes back to {replayedStatus}.',
  explain_STATUS_STANDS: 'The status {status} stands; the log is repaired to lead to it.',
  explain_NO_HOLD_BACK_TO_UNUSED: 'No ACTIVE hold holds it, so it goes back to UNUSED.',
  explain_REDEMPTION_ROW_RESTORED: 'Its row ({redemptionId}) is there with the status {redemptionStatus}: it goes back to USED.',
  explain_USED_MORE_THAN_ONCE:
    '{count} USED redemptions (orders {orderNos}) reference this one coupon: it was used more than once. Which use stands is for an operator to decide.',
  explain_REDEMPTION_COUPON_GONE:
    'The redemption references a user coupon row that no longer exists; its template cannot be told from the tables, so an operator decides.',
  explain_LOCKED_WITHOUT_HOLD: 'LOCKED but no ACTIVE hold references it: release it to {releaseTo} through the state machine.',
  explain_HOLD_ORDER_USED_COUPON: 'ACTIVE, but the order used the coupon (redemption {redemptionId}): close the hold as CONFIRMED.',
  explain_HOLD_COUPON_NOT_LOCKED: 'ACTIVE, but its coupon is {status}: close the hold as RELEASED (RECONCILIATION).',
  explain_HOLD_COUPON_LOCKED_FOR_ANOTHER: 'ACTIVE, but its coupon is LOCKED for another hold: close the hold as RELEASED (RECONCILIATION).',
  explain_HOLD_COUPON_GONE: 'ACTIVE, but its coupon is gone: close the hold as RELEASED (RECONCILIATION).',
  explain_HOLD_LOCK_UNTIL_WRONG:
    "ACTIVE, and its coupon is LOCKED for no other hold, but locked until {lockedUntil} where the hold ends at {holdExpiresAt}: set the coupon's lock back to the hold's end.",
  explain_REFUND_REPLACEMENT_MISSING:
    'Refund {refundNo} returned the coupon to user {userId} as user coupon {missingUserCouponId}, whose row is gone.',
  explain_RETURN_AGAIN: 'Issue the user the returned coupon again, as the refund did.',
  explain_REFUND_REDEMPTION_MISSING:
    "Refund {refundNo} names redemption {missingRedemptionId}, which is gone; the order's use of the coupon is redemption {redemptionId} (recreated under a new id): another refund number would refund it again.",
  explain_REPOINT_REFUND: 'Make the refund name that redemption.',
  explain_REFUNDED_TWICE: 'Refund {otherRefundNo} already names it: the use was refunded twice, which an operator decides.',
  explain_REPLACEMENT_HAD_HISTORY:
    'Its log, a redemption, a refund or a coupon replacing it shows it was used or moved on before it was lost: another coupon could give the user a second use, so an operator decides.',
  explain_USER_LIMIT_EXCEEDED:
    'User {userId} holds {held} coupons of this template from grabs and bulk issuance ({userCouponIds}), more than its limit of {perUserLimit}: an operator decides which the user should not have.',
  explain_REDEMPTION_DISCOUNT_EXCEEDED:
    "Used on order {orderNo}, it took {discountCents} off an order of {orderAmountCents}, where its template's rule takes {ruleDiscountCents} off: an operator decides.",
  explain_ORDER_DISCOUNT_EXCEEDED:
    'The coupons used on order {orderNo} took {discountCents} off an order of {orderAmountCents}: an operator decides.',
  explain_ORDER_ROW_MISSING:
    "Holds, redemptions or refunds name order {orderNo}, whose order row is gone: the order audit cannot check its discounts, and its next coupon would write the row again with that coupon's amount, as not refunded.",
  explain_RECREATE_ORDER_ROW:
    'Put the row back: an order of {orderAmountCents} (the smallest amount its coupons named), refunded if a refund names it, created with its first hold, redemption or refund.',
  explain_ORDER_AMOUNT_UNKNOWN:
    'Only refunds name it, and a refund keeps no amount: an operator decides (once its lost redemption is recreated, the next run proposes the row).',
  explain_ORDER_NOT_REFUNDED:
    '{refundCount} refund(s) name order {orderNo}, the first made at {refundedAt}, but its order row says it is not refunded: it takes new coupons, which a refunded order refuses.',
  explain_MARK_ORDER_REFUNDED: 'Mark the order refunded, as its refunds did: from then on it takes no new coupon.',
  explain_TAKEN_AFTER_REFUND:
    'From its first refund on it took {redemptionCount} coupon(s) in redemptions: discounts a refunded order should not have had. Approval leaves them as they are: an operator decides.',
  explain_HOLDS_RELEASED_WITH_MARK: '{holdCount} coupon(s) are held for it: approval releases them, as a refund does.',
};

export const EXPLANATIONS_ZH_CN: typeof EXPLANATIONS_EN = {
  explain_STOCK_UNITS_LOST: '库存少了 {count} 张，但没有对应发出的券：建议补回库存。',
  explain_STOCK_UNITS_EXCESS: '比总库存多出 {count} 张：建议从剩余库存中扣除。',
  explain_STOCK_OVER_ISSUED:
    '从库存发出了 {issuedFromStock} 张券，超过总库存 {initStock}，且仍剩余 {stock}：建议按已发出的数量结束发放（总库存改为 {issuedFromStock}，不再剩余）。',
  explain_STOCK_ROW_MISSING:
    '该活动没有库存记录：建议按已抢光重建（总库存 = 已发出的 {issuedFromStock} 张，不再剩余）；如需继续发放，之后再增加库存。',
  explain_USED_BY_ORDER: '有一条「USED」的核销记录引用了这张券：已有订单使用了它。',
  explain_USE_LOGGED_REDEMPTION_MISSING: '状态日志记录了它的使用（{txId}，日志行 {logId}），但核销记录缺失：建议按日志重建。',
  explain_USED_WITHOUT_USE: '状态为「USED」，但既没有核销记录，日志中也没有订单使用它：建议将状态改回日志停留的「{targetStatus}」。',
  explain_STATUS_NOT_IN_LIFECYCLE: '「{status}」不是券生命周期中的状态：建议将状态改回日志停留的「{targetStatus}」。',
  explain_LOCKED_BY_LIVE_HOLD: '状态日志最后为「LOCKED」，订单 {orderNo} 的锁券仍有效：建议将状态恢复为「LOCKED」。',
  explain_EXPIRED_TOO_EARLY: '未到有效期就成了「EXPIRED」，而日志从未记录过期：建议将状态改回日志停留的「{targetStatus}」。',
  explain_LOG_STATUS_CANNOT_FOLLOW:
    '完整且合法的状态日志停在「{replayedStatus}」，从它到不了「{status}」：建议将状态改回「{replayedStatus}」。',
  explain_STATUS_STANDS: '保留当前状态「{status}」，补写或修正状态日志。',
  explain_NO_HOLD_BACK_TO_UNUSED: '没有有效的锁券锁定它，因此改回「UNUSED」。',
  explain_REDEMPTION_ROW_RESTORED: '它的核销记录（{redemptionId}）仍在，状态为「{redemptionStatus}」：改回「USED」。',
  explain_USED_MORE_THAN_ONCE:
    '{count} 条「USED」的核销记录（订单 {orderNos}）引用同一张券：它被使用了不止一次。哪次使用有效，由运营人员决定。',
  explain_REDEMPTION_COUPON_GONE: '该核销记录引用的用户券已不存在；无法从数据表判断它属于哪个活动，由运营人员决定。',
  explain_LOCKED_WITHOUT_HOLD: '状态为「LOCKED」，但没有有效的锁券引用它：建议通过状态机释放为「{releaseTo}」。',
  explain_HOLD_ORDER_USED_COUPON: '锁券仍有效，但订单已使用了这张券（核销记录 {redemptionId}）：建议将锁券关闭为「CONFIRMED」。',
  explain_HOLD_COUPON_NOT_LOCKED: '锁券仍有效，但它的券状态为「{status}」：建议将锁券关闭为「RELEASED」（RECONCILIATION）。',
  explain_HOLD_COUPON_LOCKED_FOR_ANOTHER: '锁券仍有效，但它的券被另一笔锁券锁定：建议将锁券关闭为「RELEASED」（RECONCILIATION）。',
  explain_HOLD_COUPON_GONE: '锁券仍有效，但它的券已不存在：建议将锁券关闭为「RELEASED」（RECONCILIATION）。',
  explain_HOLD_LOCK_UNTIL_WRONG:
    '锁券仍有效，券为「LOCKED」且未被其他锁券占用，但锁定至 {lockedUntil}，而锁券到 {holdExpiresAt} 结束：建议将券的锁定时间改回锁券的结束时间。',
  explain_REFUND_REPLACEMENT_MISSING: '退款 {refundNo} 已将券退还给用户 {userId}（用户券 {missingUserCouponId}），但这张券的记录不见了。',
  explain_RETURN_AGAIN: '按退款时的方式，重新给该用户发放退还券。',
  explain_REFUND_REDEMPTION_MISSING:
    '退款 {refundNo} 指向的核销记录 {missingRedemptionId} 已不存在；该订单对这张券的使用现为核销记录 {redemptionId}（以新编号重建）：换一个退款单号会再退一次。',
  explain_REPOINT_REFUND: '让该退款指向这条核销记录。',
  explain_REFUNDED_TWICE: '退款 {otherRefundNo} 已指向它：这次使用被退款了两次，由运营人员决定。',
  explain_REPLACEMENT_HAD_HISTORY:
    '它的日志、核销、退款或替换它的券表明，它在丢失前已被使用或已有变动：再发一张可能让用户多用一次，由运营人员决定。',
  explain_USER_LIMIT_EXCEEDED:
    '用户 {userId} 通过抢券和批量发放持有本券 {held} 张（{userCouponIds}），超过每人限领 {perUserLimit} 张：由运营人员决定该用户不应持有哪几张。',
  explain_REDEMPTION_DISCOUNT_EXCEEDED:
    '用于订单 {orderNo}，对 {orderAmountCents} 的订单优惠了 {discountCents}，而券模板的规则只优惠 {ruleDiscountCents}：由运营人员决定。',
  explain_ORDER_DISCOUNT_EXCEEDED: '订单 {orderNo} 使用的券共优惠了 {discountCents}，超过订单金额 {orderAmountCents}：由运营人员决定。',
  explain_ORDER_ROW_MISSING:
    '锁券、核销或退款记录指向订单 {orderNo}，但该订单的订单记录不见了：订单核对无法检查它的优惠，且它的下一张券会按那张券的金额重新写入订单记录，并记为未退款。',
  explain_RECREATE_ORDER_ROW:
    '建议补回订单记录：订单金额 {orderAmountCents}（取它的券所记的最小金额），有退款指向它则记为已退款，创建时间取它最早的锁券、核销或退款。',
  explain_ORDER_AMOUNT_UNKNOWN:
    '只有退款记录指向它，而退款不记金额：由运营人员决定（它缺失的核销记录重建后，下一次对账会提出补回订单记录）。',
  explain_ORDER_NOT_REFUNDED:
    '{refundCount} 条退款记录指向订单 {orderNo}，最早一条退款于 {refundedAt}，但该订单的订单记录显示未退款：它仍会接受新的券，而已退款的订单应当拒绝。',
  explain_MARK_ORDER_REFUNDED: '建议将订单标记为已退款，与它的退款一致：此后它不再接受新的券。',
  explain_TAKEN_AFTER_REFUND:
    '自首次退款起，该订单又核销了 {redemptionCount} 张券：这些是已退款订单本不应得到的优惠。批准不会改动它们：由运营人员决定。',
  explain_HOLDS_RELEASED_WITH_MARK: '仍有 {holdCount} 张券锁定在该订单上：批准时会像退款一样释放它们。',
};
