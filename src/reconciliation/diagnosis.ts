import { parseTxId, TxIds } from '../ledger/tx-id.js';
import { replay, TRANSITIONS, USER_COUPON_STATUSES, UserCouponStatus } from '../ledger/transitions.js';
import type { HoldClosing } from '../redemption/holds.js';
import { explained, type Explained, type ExplanationPart, sentence } from './explanations.js';

export const DISCREPANCY_TYPES = [
  'STOCK_MISMATCH',
  'USED_WITHOUT_REDEMPTION',
  'REDEMPTION_WITHOUT_USED',
  'LOG_MISMATCH',
  'LOCKED_WITHOUT_HOLD',
  'HOLD_WITHOUT_LOCKED',
  'ORDER_DISCOUNT_EXCEEDED',
  'USER_LIMIT_EXCEEDED',
  'REFUND_REPLACEMENT_MISSING',
  'REFUND_REDEMPTION_MISSING',
  'REDEMPTION_DISCOUNT_EXCEEDED',
  'ORDER_ROW_MISSING',
  'ORDER_NOT_REFUNDED',
] as const;
export type DiscrepancyType = (typeof DISCREPANCY_TYPES)[number];

export const COMPENSATION_ACTIONS = [
  'RESTORE_STOCK',
  'REMOVE_STOCK',
  'ADOPT_ISSUED',
  'RECREATE_STOCK',
  'MARK_CONSISTENT',
  'RELEASE_COUPON',
  'CLOSE_HOLD',
  'SET_LOCKED_UNTIL',
  'REISSUE_REPLACEMENT',
  'REPOINT_REFUND',
  'RECREATE_ORDER',
  'MARK_ORDER_REFUNDED',
  'MANUAL_REVIEW',
] as const;
export type CompensationAction = (typeof COMPENSATION_ACTIONS)[number];

export interface LogEntry {
  id: string;
  from: UserCouponStatus | null;
  to: UserCouponStatus;
  txId: string;
  reason: string | null;
  createdAt: Date;
}

export interface UsedRedemption {
  id: string;
  orderNo: string;
}

/** A redemption row whose status the service never writes (it only writes USED): damage, as the status is. */
export interface OtherRedemption extends UsedRedemption {
  status: string;
}

export interface ActiveHold {
  id: string;
  orderNo: string;
  expiresAt: Date;
}

/** Everything the tables say about one user coupon, read in one snapshot. */
export interface UserCouponFacts {
  userCouponId: string;
  couponId: string;
  userId: string;
  status: UserCouponStatus;
  usedAt: Date | null;
  /** Past its expires_at when read. */
  expired: boolean;
  /** Its state-log rows in id order. */
  log: LogEntry[];
  /** Redemptions with status USED that reference it. */
  usedRedemptions: UsedRedemption[];
  /** Redemptions with any other status that reference it. */
  otherRedemptions: OtherRedemption[];
  /** Its ACTIVE holds. */
  activeHolds: ActiveHold[];
}

/** A log row to write; txId/reason null means "name the compensation that writes it". */
export interface PlannedLogRow {
  from: UserCouponStatus | null;
  to: UserCouponStatus;
  txId: string | null;
  reason: string | null;
  createdAt: string | null;
}

/** One step of a MARK_CONSISTENT repair, executed in order in the approving transaction. */
export type RepairStep =
  | { op: 'REMOVE_LOG'; logIds: string[] }
  | { op: 'APPEND_LOG'; rows: PlannedLogRow[] }
  | { op: 'SET_STATUS'; from: UserCouponStatus; to: UserCouponStatus }
  | { op: 'TRANSIT'; from: UserCouponStatus; to: UserCouponStatus; txId: string | null }
  /** The discount is the template's, on the order's amount, worked out when approved (a proposal stored before kept a discountCents it ignores). */
  | { op: 'RECREATE_REDEMPTION'; orderNo: string; userId: string; usedAt: string }
  | { op: 'RESTORE_REDEMPTION'; redemptionId: string; from: string }
  | { op: 'CLOSE_HOLDS'; holds: { holdId: string; closeAs: HoldClosing }[] };

/** What the repair expects to find when it is approved; anything else means the data moved since the run. */
export interface RepairExpectation {
  status: UserCouponStatus;
  logIds: string[];
  usedRedemptionIds: string[];
  /** Absent in proposals made before holds were part of the repair. */
  activeHoldIds?: string[];
}

export interface RepairParams {
  userCouponId: string;
  expect: RepairExpectation;
  steps: RepairStep[];
}

export interface UserCouponFinding {
  type: 'USED_WITHOUT_REDEMPTION' | 'REDEMPTION_WITHOUT_USED' | 'LOG_MISMATCH';
  couponId: string;
  userCouponId: string;
  redemptionId: string | null;
  details: {
    status: UserCouponStatus;
    replayedStatus: UserCouponStatus | null;
    replayLegal: boolean;
    /** The break point: the last log row of the longest prefix that is legal and can still lead to the target status. */
    lastConsistentLogId: string | null;
    firstInconsistentLogId: string | null;
    usedRedemptionIds: string[];
    targetStatus: UserCouponStatus;
  } & Explained;
  action: 'MARK_CONSISTENT';
  params: RepairParams;
}

/** A coupon used by more than one order: money was taken off twice, and which use stands is an operator's call. */
export interface DoubleUseFinding {
  type: 'REDEMPTION_WITHOUT_USED';
  couponId: string;
  userCouponId: string;
  redemptionId: string;
  details: { status: string; usedRedemptionIds: string[]; orderNos: string[] } & Explained;
  action: 'MANUAL_REVIEW';
  params: { userCouponId: string; redemptionIds: string[] };
}

const isStatus = (s: string): s is UserCouponStatus => (USER_COUPON_STATUSES as readonly string[]).includes(s);

/** Shortest legal path of transitions from `from` (null: not yet issued) to `to`; [] when equal, null when unreachable. */
export function legalPath(from: UserCouponStatus | null, to: UserCouponStatus): [UserCouponStatus | null, UserCouponStatus][] | null {
  if (from === to) return [];
  const prev = new Map<UserCouponStatus, UserCouponStatus | null>();
  const queue: (UserCouponStatus | null)[] = [from];
  while (queue.length > 0) {
    const s = queue.shift() as UserCouponStatus | null;
    for (const next of TRANSITIONS[s ?? 'null']) {
      if (prev.has(next) || next === from) continue;
      prev.set(next, s);
      if (next === to) {
        const steps: [UserCouponStatus | null, UserCouponStatus][] = [];
        for (let cur: UserCouponStatus | null = to; cur !== from; cur = prev.get(cur as UserCouponStatus) as UserCouponStatus | null) {
          steps.unshift([prev.get(cur as UserCouponStatus) as UserCouponStatus | null, cur as UserCouponStatus]);
        }
        return steps;
      }
      queue.push(next);
    }
  }
  return null;
}

/** The order number of a log row written by a redemption, else null. */
function orderOf(l: LogEntry): string | null {
  const ref = parseTxId(l.txId);
  return ref?.kind === 'order' ? ref.orderNo : null;
}

/**
 * Decides what one user coupon should look like and how to get there, from its row, its log and
 * its redemptions. Returns null when the three agree (invariants 4 and 5 of API.md hold).
 *
 * The target status: USED when a USED redemption references the coupon (an order used it); USED
 * also when there is no redemption but the legal log records the use with an order number (the
 * redemption row is what was lost, and is recreated from the log); a USED row with neither goes
 * back to where the log left it, as does a status that is not one of the lifecycle's; otherwise
 * the state a complete legal log reached when the row cannot follow from it, else the row's own
 * status; LOCKED only while a hold holds it. Leaving LOCKED closes the coupon's ACTIVE holds in the
 * same repair (invariant 6). A coupon used by two orders is left to an operator. The log is then cut
 * back to the longest legal prefix from which the target is reachable (the break point) and
 * completed with the legal path to the target.
 */
export function diagnoseUserCoupon(f: UserCouponFacts): UserCouponFinding | DoubleUseFinding | null {
  if (f.usedRedemptions.length > 1) return doubleUse(f);
  const r = replay(f.log);
  const logOk = r.legal && r.status === f.status;
  const hasRedemption = f.usedRedemptions.length > 0;
  const usedOk = (f.status === 'USED') === hasRedemption;
  if (logOk && usedOk) return null;

  const legalPrefix = f.log.slice(0, r.lastConsistentIndex + 1);
  let target: UserCouponStatus;
  let recreateFrom: LogEntry | undefined;
  const why: ExplanationPart[] = [];
  // The redemption module logs a use with the order in the same transaction as the redemption row: evidence of the use even when that row is gone.
  const usedByOrder = hasRedemption ? undefined : legalPrefix.find((s) => s.to === 'USED' && orderOf(s) !== null);
  if (hasRedemption) {
    target = 'USED';
    why.push(sentence('USED_BY_ORDER'));
  } else if (usedByOrder) {
    target = 'USED';
    recreateFrom = usedByOrder;
    why.push(sentence('USE_LOGGED_REDEMPTION_MISSING', { txId: usedByOrder.txId, logId: usedByOrder.id }));
  } else if (f.status === 'USED' || !isStatus(f.status)) {
    target = r.status === null || r.status === 'USED' ? 'UNUSED' : r.status;
    why.push(
      f.status === 'USED'
        ? sentence('USED_WITHOUT_USE', { targetStatus: target })
        : sentence('STATUS_NOT_IN_LIFECYCLE', { status: f.status, targetStatus: target }),
    );
  } else if (f.log.at(-1)?.to === 'LOCKED' && f.status !== 'LOCKED' && f.activeHolds.length > 0) {
    // The hold agrees with the log: the status alone went astray, and releasing the hold would cancel a live checkout.
    // The log's last row decides, legal or not, as in the hold audit, which leaves such a hold to this repair.
    target = 'LOCKED';
    why.push(sentence('LOCKED_BY_LIVE_HOLD', { orderNo: f.activeHolds[0].orderNo }));
  } else if (f.status === 'EXPIRED' && !f.expired && (r.status === null || r.status === 'UNUSED' || r.status === 'LOCKED')) {
    // Only the sweep expires a coupon, once its time has come; a customer's valid coupon is not taken away by the repair.
    target = r.status ?? 'UNUSED';
    why.push(sentence('EXPIRED_TOO_EARLY', { targetStatus: target }));
  } else if (r.legal && r.status !== null && r.status !== 'USED' && legalPath(r.status, f.status) === null) {
    target = r.status;
    why.push(sentence('LOG_STATUS_CANNOT_FOLLOW', { replayedStatus: r.status, status: f.status }));
  } else {
    target = f.status;
    why.push(sentence('STATUS_STANDS', { status: f.status }));
  }

  if (target === 'LOCKED' && f.activeHolds.length === 0) {
    target = 'UNUSED';
    // "The status LOCKED stands" would be taken back by the next sentence: this one is the reason.
    if (why.at(-1)?.key === 'STATUS_STANDS') why.pop();
    why.push(sentence('NO_HOLD_BACK_TO_UNUSED'));
  }

  let keep = legalPrefix.length;
  let path = legalPath(keep === 0 ? null : f.log[keep - 1].to, target);
  while (path === null) {
    keep--;
    path = legalPath(keep === 0 ? null : f.log[keep - 1].to, target);
  }
  const removed = f.log.slice(keep);
  const reusable = [...removed];
  const useOrder = f.usedRedemptions[0]?.orderNo ?? (recreateFrom ? orderOf(recreateFrom) : null);
  const useTxId = f.usedRedemptions.length > 0 ? TxIds.order(f.usedRedemptions[0].orderNo) : (recreateFrom?.txId ?? null);
  const append: PlannedLogRow[] = path.map(([from, to]) => {
    // A removed row that recorded the same arrival keeps its tx id and time: the repair re-orders history, it does not rewrite it.
    const i = reusable.findIndex((row) => row.to === to);
    if (i >= 0) {
      const [row] = reusable.splice(i, 1);
      return { from, to, txId: row.txId, reason: row.reason, createdAt: row.createdAt.toISOString() };
    }
    return { from, to, txId: to === 'USED' ? useTxId : null, reason: null, createdAt: null };
  });

  const steps: RepairStep[] = [];
  if (f.status === 'LOCKED' && target !== 'LOCKED' && f.activeHolds.length > 0) {
    // The hold of the order that used the coupon is confirmed, any other released: no ACTIVE hold outlives the LOCKED status.
    const holds = f.activeHolds.map((h) => ({
      holdId: h.id,
      closeAs: (target === 'USED' && h.orderNo === useOrder ? 'CONFIRMED' : 'RELEASED') as HoldClosing,
    }));
    steps.push({ op: 'CLOSE_HOLDS', holds });
  }
  const plainMove =
    removed.length === 0 && append.length === 1 && append[0].from === f.status && r.status === f.status && target !== f.status;
  if (plainMove) {
    // The row and its log agree and one legal move is missing: the state machine makes it, log row included.
    steps.push({ op: 'TRANSIT', from: f.status, to: target, txId: append[0].txId });
  } else {
    if (removed.length > 0) steps.push({ op: 'REMOVE_LOG', logIds: removed.map((row) => row.id) });
    if (append.length > 0) steps.push({ op: 'APPEND_LOG', rows: append });
    if (target !== f.status) steps.push({ op: 'SET_STATUS', from: f.status, to: target });
  }
  const stored = recreateFrom && f.otherRedemptions.find((x) => x.orderNo === useOrder);
  if (stored) {
    // The order's redemption row is there with a status the service never writes: it is set back rather than inserted again.
    steps.push({ op: 'RESTORE_REDEMPTION', redemptionId: stored.id, from: stored.status });
    why.push(sentence('REDEMPTION_ROW_RESTORED', { redemptionId: stored.id, redemptionStatus: stored.status }));
  } else if (recreateFrom) {
    steps.push({
      op: 'RECREATE_REDEMPTION',
      orderNo: orderOf(recreateFrom) as string,
      userId: f.userId,
      usedAt: (f.usedAt ?? recreateFrom.createdAt).toISOString(),
    });
  }

  const type = !usedOk ? (hasRedemption ? 'REDEMPTION_WITHOUT_USED' : 'USED_WITHOUT_REDEMPTION') : 'LOG_MISMATCH';
  const usedRedemptionIds = f.usedRedemptions.map((x) => x.id);
  return {
    type,
    couponId: f.couponId,
    userCouponId: f.userCouponId,
    redemptionId: usedRedemptionIds[0] ?? null,
    details: {
      status: f.status,
      replayedStatus: r.status,
      replayLegal: r.legal,
      lastConsistentLogId: keep > 0 ? f.log[keep - 1].id : null,
      firstInconsistentLogId: removed[0]?.id ?? null,
      usedRedemptionIds,
      targetStatus: target,
      ...explained(...why),
    },
    action: 'MARK_CONSISTENT',
    params: {
      userCouponId: f.userCouponId,
      expect: { status: f.status, logIds: f.log.map((row) => row.id), usedRedemptionIds, activeHoldIds: f.activeHolds.map((h) => h.id) },
      steps,
    },
  };
}

function doubleUse(f: UserCouponFacts): DoubleUseFinding {
  const redemptionIds = f.usedRedemptions.map((x) => x.id);
  const orderNos = f.usedRedemptions.map((x) => x.orderNo);
  return {
    type: 'REDEMPTION_WITHOUT_USED',
    couponId: f.couponId,
    userCouponId: f.userCouponId,
    redemptionId: redemptionIds[1],
    details: {
      status: f.status,
      usedRedemptionIds: redemptionIds,
      orderNos,
      ...explained(sentence('USED_MORE_THAN_ONCE', { count: redemptionIds.length, orderNos: orderNos.join(', ') })),
    },
    action: 'MANUAL_REVIEW',
    params: { userCouponId: f.userCouponId, redemptionIds },
  };
}

export interface StockFacts {
  couponId: string;
  initStock: number;
  stock: number;
  issuedFromStock: number;
}

export interface StockFinding {
  type: 'STOCK_MISMATCH';
  couponId: string;
  details: StockFacts & { difference: number } & Explained;
  action: 'RESTORE_STOCK' | 'REMOVE_STOCK' | 'ADOPT_ISSUED';
  params: StockFacts & { difference: number; count: number };
}

/** A coupon without its stock row: nothing can be grabbed, and no admin stock change can apply. */
export interface MissingStockFinding {
  type: 'STOCK_MISMATCH';
  couponId: string;
  details: { couponId: string; issuedFromStock: number } & Explained;
  action: 'RECREATE_STOCK';
  params: { couponId: string };
}

/** The row comes back sold out (init_stock = issued, stock 0): it cannot oversell, and the admin adds stock as usual. */
export function diagnoseMissingStock(couponId: string, issuedFromStock: number): MissingStockFinding {
  return {
    type: 'STOCK_MISMATCH',
    couponId,
    details: {
      couponId,
      issuedFromStock,
      ...explained(sentence('STOCK_ROW_MISSING', { issuedFromStock })),
    },
    action: 'RECREATE_STOCK',
    params: { couponId },
  };
}

/**
 * Invariant 1: init_stock == stock + issued from stock, stock >= 0. `difference` is
 * init_stock - (stock + issued): positive, units vanished (stock deducted with no coupon, or an
 * issued coupon's row deleted) and go back to the stock; negative, more exists than was ever
 * created and the excess leaves the remaining stock.
 */
export function diagnoseStock(f: StockFacts): StockFinding | null {
  const difference = f.initStock - (f.stock + f.issuedFromStock);
  if (difference === 0 && f.stock >= 0) return null;
  let action: StockFinding['action'];
  let why: ExplanationPart;
  if (difference > 0) {
    action = 'RESTORE_STOCK';
    why = sentence('STOCK_UNITS_LOST', { count: difference });
  } else if (difference < 0 && f.stock >= -difference) {
    action = 'REMOVE_STOCK';
    why = sentence('STOCK_UNITS_EXCESS', { count: -difference });
  } else {
    // The excess was grabbed already (or the remaining stock is below zero): no removal can balance
    // it, and a REMOVE_STOCK proposal failed INSUFFICIENT_STOCK at every approval, run after run.
    action = 'ADOPT_ISSUED';
    why = sentence('STOCK_OVER_ISSUED', { issuedFromStock: f.issuedFromStock, initStock: f.initStock, stock: f.stock });
  }
  return {
    type: 'STOCK_MISMATCH',
    couponId: f.couponId,
    details: { ...f, difference, ...explained(why) },
    action,
    params: { ...f, difference, count: Math.abs(difference) },
  };
}
