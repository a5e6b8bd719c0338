import { Injectable } from '@nestjs/common';
import type { EntityManager, QueryRunner } from 'typeorm';
import { findLog } from '../ledger/state-log.js';
import { TRANSITIONS, UserCouponStatus } from '../ledger/transitions.js';
import { findReplacement } from '../ledger/user-coupons.js';
import { type HoldFinding, idList, type OrderDiscountFinding, type OrderRowFinding } from './hold-audit.js';
import {
  diagnoseMissingStock,
  diagnoseStock,
  diagnoseUserCoupon,
  DoubleUseFinding,
  LogEntry,
  MissingStockFinding,
  StockFinding,
  UserCouponFacts,
  UserCouponFinding,
} from './diagnosis.js';
import { explained, type Explained, sentence } from './explanations.js';

type Queryable = Pick<QueryRunner | EntityManager, 'query'>;

/** A redemption whose user coupon row does not exist: nothing left to say which template it was. */
export interface OrphanRedemptionFinding {
  type: 'REDEMPTION_WITHOUT_USED';
  couponId: null;
  userCouponId: string;
  redemptionId: string;
  details: { orderNo: string; userId: string } & Explained;
  action: 'MANUAL_REVIEW';
  params: { redemptionId: string; userCouponId: string };
}

/** A redemption that took more off its order than its template's rule gives on the amount it names (an edit by hand). */
export interface RedemptionDiscountFinding {
  type: 'REDEMPTION_DISCOUNT_EXCEEDED';
  couponId: string;
  userCouponId: string;
  redemptionId: string;
  details: {
    orderNo: string;
    userId: string;
    orderAmountCents: number;
    discountCents: number;
    ruleDiscountCents: number;
  } & Explained;
  action: 'MANUAL_REVIEW';
  params: { redemptionId: string; userCouponId: string };
}

/** A user holding more coupons of a template from grabs and bulk issuance than its perUserLimit (invariant 2). */
export interface UserLimitFinding {
  type: 'USER_LIMIT_EXCEEDED';
  couponId: string;
  userCouponId: string;
  redemptionId: null;
  details: { couponId: string; userId: string; perUserLimit: number; held: number; userCouponIds: string[] } & Explained;
  action: 'MANUAL_REVIEW';
  params: { couponId: string; userId: string; userCouponIds: string[] };
}

/** A refund whose returned coupon's row is gone: the user lost what the refund gave back. */
export interface RefundReplacementFinding {
  type: 'REFUND_REPLACEMENT_MISSING';
  couponId: string;
  userCouponId: string;
  redemptionId: string;
  details: { refundId: string; refundNo: string; orderNo: string; userId: string; missingUserCouponId: string } & Explained;
  action: 'REISSUE_REPLACEMENT' | 'MANUAL_REVIEW';
  params: { refundId: string; userCouponId: string; missingUserCouponId: string };
}

/**
 * Whether a lost user coupon had moved on from UNUSED: its log (which may have outlived its row)
 * ends elsewhere, or a redemption, a refund or another coupon names it. Returning another coupon
 * in its place would then hand the user a second use.
 */
export async function hadHistory(q: Queryable, userCouponId: string): Promise<boolean> {
  const last = (await findLog(q, userCouponId)).at(-1);
  if ((last && last.toStatus !== 'UNUSED') || (await findReplacement(q, userCouponId)) !== null) return true;
  const [row]: { named: string | number }[] = await q.query(
    `SELECT EXISTS (SELECT 1 FROM redemption WHERE user_coupon_id = ?) OR EXISTS (SELECT 1 FROM refund WHERE user_coupon_id = ?) AS named`,
    [userCouponId, userCouponId],
  );
  return Number(row.named) === 1;
}

/** A refund naming a redemption that is gone while the order's redemption of the coupon is there under another id. */
export interface RefundRedemptionFinding {
  type: 'REFUND_REDEMPTION_MISSING';
  couponId: string;
  userCouponId: string;
  redemptionId: string;
  details: { refundId: string; refundNo: string; orderNo: string; missingRedemptionId: string; otherRefundId: string | null } & Explained;
  action: 'REPOINT_REFUND' | 'MANUAL_REVIEW';
  params: { refundId: string; missingRedemptionId: string; redemptionId: string };
}

export type Finding =
  | RefundRedemptionFinding
  | RefundReplacementFinding
  | StockFinding
  | MissingStockFinding
  | UserCouponFinding
  | DoubleUseFinding
  | OrphanRedemptionFinding
  | RedemptionDiscountFinding
  | HoldFinding
  | OrderDiscountFinding
  | OrderRowFinding
  | UserLimitFinding;

export interface ChunkResult {
  checked: number;
  findings: Finding[];
  /** The redemption chunks' share of the run's totals (RunTotals). */
  uses?: Uses;
}

/** USED redemptions and their discount, and those refunded (a refund leaves its redemption USED). */
export interface Uses {
  redemptions: number;
  discountCents: number;
  refundedRedemptions: number;
  refundedDiscountCents: number;
}

/** Every legal step as 'FROM>TO' ('null' before issuance), from the one transition table. */
const LEGAL_STEPS = Object.entries(TRANSITIONS).flatMap(([from, tos]) => tos.map((to) => `'${from}>${to}'`));

const count = async (q: Queryable, sql: string, params: unknown[]): Promise<number> =>
  Number(((await q.query(sql, params)) as { n: string }[])[0].n);

/**
 * Reads the facts of some user coupons (row, log, redemptions, ACTIVE holds). A compensation locks the row
 * through the ledger first, so it reads them as nobody else can change them.
 */
export async function loadUserCouponFacts(q: Queryable, ids: string[]): Promise<UserCouponFacts[]> {
  if (ids.length === 0) return [];
  const rows: { id: string; coupon_id: string; user_id: string; status: UserCouponStatus; used_at: Date | null; expired: number }[] =
    await q.query(
      `SELECT id, coupon_id, user_id, status, used_at, expires_at <= ? AS expired FROM user_coupon WHERE id IN (?) ORDER BY id`,
      [new Date(), ids],
    );
  const logs: {
    id: string;
    user_coupon_id: string;
    from_status: UserCouponStatus | null;
    to_status: UserCouponStatus;
    tx_id: string;
    reason: string | null;
    created_at: Date;
  }[] = await q.query(
    `SELECT id, user_coupon_id, from_status, to_status, tx_id, reason, created_at FROM user_coupon_state_log WHERE user_coupon_id IN (?) ORDER BY user_coupon_id, id`,
    [ids],
  );
  const redemptions: { id: string; user_coupon_id: string; order_no: string; status: string }[] = await q.query(
    `SELECT id, user_coupon_id, order_no, status FROM redemption WHERE user_coupon_id IN (?) ORDER BY id`,
    [ids],
  );
  const holds: { id: string; user_coupon_id: string; order_no: string; expires_at: Date }[] = await q.query(
    `SELECT id, user_coupon_id, order_no, expires_at FROM redemption_hold WHERE user_coupon_id IN (?) AND status = 'ACTIVE' ORDER BY id`,
    [ids],
  );
  return rows.map((uc) => ({
    userCouponId: uc.id,
    couponId: uc.coupon_id,
    userId: uc.user_id,
    status: uc.status,
    usedAt: uc.used_at,
    expired: Boolean(Number(uc.expired)),
    log: logs
      .filter((l) => l.user_coupon_id === uc.id)
      .map((l): LogEntry => ({ id: l.id, from: l.from_status, to: l.to_status, txId: l.tx_id, reason: l.reason, createdAt: l.created_at })),
    usedRedemptions: redemptions
      .filter((r) => r.user_coupon_id === uc.id && r.status === 'USED')
      .map((r) => ({ id: String(r.id), orderNo: r.order_no })),
    otherRedemptions: redemptions
      .filter((r) => r.user_coupon_id === uc.id && r.status !== 'USED')
      .map((r) => ({ id: String(r.id), orderNo: r.order_no, status: r.status })),
    activeHolds: holds
      .filter((h) => h.user_coupon_id === uc.id)
      .map((h) => ({ id: String(h.id), orderNo: h.order_no, expiresAt: h.expires_at })),
  }));
}

/**
 * The audits, one bounded chunk at a time. Each chunk is a few set-based statements over primary
 * key ranges and the (user_coupon_id, ...) indexes, so the work per chunk and the memory held do
 * not depend on the size of the tables. Only suspects are read row by row.
 */
@Injectable()
export class AuditService {
  /** Lowest and highest id of a table, or null when it is empty. */
  async idRange(
    q: Queryable,
    table: 'user_coupon' | 'redemption' | 'redemption_hold' | 'refund',
  ): Promise<{ min: bigint; max: bigint } | null> {
    const [row]: { lo: string | null; hi: string | null }[] = await q.query(`SELECT MIN(id) AS lo, MAX(id) AS hi FROM ${table}`);
    return row.lo === null || row.hi === null ? null : { min: BigInt(row.lo), max: BigInt(row.hi) };
  }

  /** Invariant 1 for the coupons after `afterCouponId`, at most `limit` of them, their stock row missing included; one statement, so one snapshot. */
  async stockChunk(q: Queryable, afterCouponId: string, limit: number): Promise<ChunkResult & { lastCouponId: string | null }> {
    const rows: { coupon_id: string; init_stock: string | null; stock: string | null; issued: string }[] = await q.query(
      `SELECT c.id AS coupon_id, s.init_stock, s.stock,
              (SELECT COUNT(*) FROM user_coupon uc WHERE uc.coupon_id = c.id AND uc.from_stock = 1) AS issued
       FROM coupon c LEFT JOIN coupon_stock s ON s.coupon_id = c.id WHERE c.id > ? ORDER BY c.id LIMIT ?`,
      [afterCouponId, limit],
    );
    const findings = rows
      .map((r) =>
        r.init_stock === null || r.stock === null
          ? diagnoseMissingStock(String(r.coupon_id), Number(r.issued))
          : diagnoseStock({
              couponId: r.coupon_id,
              initStock: Number(r.init_stock),
              stock: Number(r.stock),
              issuedFromStock: Number(r.issued),
            }),
      )
      .filter((f) => f !== null);
    return { checked: rows.length, findings, lastCouponId: rows.at(-1)?.coupon_id ?? null };
  }

  /**
   * Invariant 2 for the coupons after `afterCouponId`, at most `limit` of them: users holding more
   * of one from grabs and bulk issuance than its perUserLimit (a copied row, a limit lowered by
   * hand). Only an operator can tell which coupon the user should not have, and one may already be
   * used, so the proposal is a review naming them all. A stock that counts the extra coupon is
   * reported on its own (STOCK_MISMATCH). Grouped on the (coupon_id, user_id) index's own order, the
   * scan needs no temporary table (grouped by the limit too, it took one, and three times as long).
   * The rows were counted by the stock audit already: `checked` is 0.
   */
  async userLimitChunk(q: Queryable, afterCouponId: string, limit: number): Promise<ChunkResult & { lastCouponId: string | null }> {
    const coupons: { id: string; per_user_limit: number }[] = await q.query(
      `SELECT id, per_user_limit FROM coupon WHERE id > ? ORDER BY id LIMIT ?`,
      [afterCouponId, limit],
    );
    if (coupons.length === 0) return { checked: 0, findings: [], lastCouponId: null };
    const limits = new Map(coupons.map((c) => [String(c.id), Number(c.per_user_limit)]));
    const rows: { coupon_id: string; user_id: string; held: string; ids: string }[] = await q.query(
      `SELECT uc.coupon_id, uc.user_id, COUNT(*) AS held, GROUP_CONCAT(uc.id ORDER BY uc.id) AS ids
       FROM user_coupon uc
       WHERE uc.coupon_id IN (?) AND uc.source IN ('GRAB', 'BULK')
       GROUP BY uc.coupon_id, uc.user_id
       HAVING COUNT(*) > (SELECT c.per_user_limit FROM coupon c WHERE c.id = uc.coupon_id)`,
      [[...limits.keys()]],
    );
    const findings = rows.map((r): UserLimitFinding => {
      const userCouponIds = idList(r.ids);
      const [couponId, userId, held] = [String(r.coupon_id), r.user_id, Number(r.held)];
      const perUserLimit = limits.get(couponId) as number;
      return {
        type: 'USER_LIMIT_EXCEEDED',
        couponId,
        // The newest: the one the limit should have refused.
        userCouponId: userCouponIds[userCouponIds.length - 1],
        redemptionId: null,
        details: {
          couponId,
          userId,
          perUserLimit,
          held,
          userCouponIds,
          ...explained(sentence('USER_LIMIT_EXCEEDED', { userId, held, perUserLimit, userCouponIds: userCouponIds.join(', ') })),
        },
        action: 'MANUAL_REVIEW',
        params: { couponId, userId, userCouponIds },
      };
    });
    return { checked: 0, findings, lastCouponId: String(coupons[coupons.length - 1].id) };
  }

  /**
   * Invariants 4 and 5 for the user coupons with ids in [lo, hi]. SQL flags the suspects: a USED
   * status without a USED redemption or the reverse, more than one USED redemption, and a log that does not replay (LAG over the
   * log in id order: each step must start where the previous one ended and be in the transition
   * table, and the last must end at the current status). With `logSince`, the log is checked only
   * for coupons updated since then, and for `recheck` (those whose discrepancy was decided since).
   * Suspects are then diagnosed in full by diagnoseUserCoupon.
   * Call it inside a consistent-snapshot transaction so the two reads agree.
   */
  async userCouponChunk(
    q: Queryable,
    lo: bigint,
    hi: bigint,
    logSince: Date | null,
    recheck: readonly string[] = [],
  ): Promise<ChunkResult> {
    const range = [String(lo), String(hi)];
    const again = recheck.filter((id) => BigInt(id) >= lo && BigInt(id) <= hi);
    const changed = (alias: string) => `(${alias}updated_at >= ?${again.length > 0 ? ` OR ${alias}id IN (?)` : ''})`;
    const changedParams = logSince ? [logSince, ...(again.length > 0 ? [again] : [])] : [];
    const logFilter = logSince ? `AND user_coupon_id IN (SELECT id FROM user_coupon WHERE id BETWEEN ? AND ? AND ${changed('')})` : '';
    // Statuses compare as bytes: the columns' collation ignores case and trailing spaces, the service does not ('used' is no status).
    const logBroken = 'g.user_coupon_id IS NULL OR g.bad > 0 OR BINARY g.last_status <> uc.status';
    const suspects: { id: string }[] = await q.query(
      `SELECT uc.id
       FROM user_coupon uc
       LEFT JOIN (
         SELECT user_coupon_id, COUNT(*) AS n FROM redemption
         WHERE user_coupon_id BETWEEN ? AND ? AND BINARY status = 'USED' GROUP BY user_coupon_id
       ) r ON r.user_coupon_id = uc.id
       LEFT JOIN (
         SELECT user_coupon_id,
                SUM(NOT (BINARY from_status <=> prev AND BINARY CONCAT(COALESCE(from_status, 'null'), '>', to_status) IN (${LEGAL_STEPS.join(', ')}))) AS bad,
                MAX(CASE WHEN next_id IS NULL THEN to_status END) AS last_status
         FROM (
           SELECT user_coupon_id, from_status, to_status, LAG(to_status) OVER w AS prev, LEAD(id) OVER w AS next_id
           FROM user_coupon_state_log
           WHERE user_coupon_id BETWEEN ? AND ? ${logFilter}
           WINDOW w AS (PARTITION BY user_coupon_id ORDER BY id)
         ) steps
         GROUP BY user_coupon_id
       ) g ON g.user_coupon_id = uc.id
       WHERE uc.id BETWEEN ? AND ?
         AND ((BINARY uc.status = 'USED') <> (r.n IS NOT NULL) OR r.n > 1 OR ${logSince ? `(${changed('uc.')} AND (${logBroken}))` : logBroken})
       ORDER BY uc.id`,
      [...range, ...range, ...(logSince ? [...range, ...changedParams] : []), ...range, ...changedParams],
    );
    const checked = await count(q, `SELECT COUNT(*) AS n FROM user_coupon WHERE id BETWEEN ? AND ?`, range);
    const facts = await loadUserCouponFacts(
      q,
      suspects.map((s) => s.id),
    );
    const findings = facts.map(diagnoseUserCoupon).filter((f) => f !== null);
    return { checked, findings };
  }

  /**
   * Refunds in [lo, hi] whose returned coupon (replacement_user_coupon_id) has no row: the user lost
   * it, and the refund, answering for that coupon, would never return another. A refund whose
   * redemption is gone is found with the coupon it used (USED_WITHOUT_REDEMPTION), and its
   * redemption comes back under the id the refund names.
   */
  async refundChunk(q: Queryable, lo: bigint, hi: bigint): Promise<ChunkResult> {
    const range = [String(lo), String(hi)];
    const rows: {
      id: string;
      refund_no: string;
      order_no: string;
      redemption_id: string;
      user_coupon_id: string;
      replacement_user_coupon_id: string;
      coupon_id: string;
      user_id: string;
    }[] = await q.query(
      // STRAIGHT_JOIN: the missing replacements first, then their refunded coupons, not every refund's coupon (at 500,000
      // refunds a second read of user_coupon pages spread over the whole table).
      `SELECT STRAIGHT_JOIN f.id, f.refund_no, f.order_no, f.redemption_id, f.user_coupon_id, f.replacement_user_coupon_id, uc.coupon_id, uc.user_id
       FROM refund f LEFT JOIN user_coupon rep ON rep.id = f.replacement_user_coupon_id JOIN user_coupon uc ON uc.id = f.user_coupon_id
       WHERE f.id BETWEEN ? AND ? AND f.replacement_user_coupon_id IS NOT NULL AND rep.id IS NULL ORDER BY f.id`,
      range,
    );
    const checked = await count(q, `SELECT COUNT(*) AS n FROM refund WHERE id BETWEEN ? AND ?`, range);
    const findings: (RefundReplacementFinding | RefundRedemptionFinding)[] = await this.refundsOfLostRedemptions(q, range);
    for (const r of rows) {
      const [refundId, missingUserCouponId] = [String(r.id), String(r.replacement_user_coupon_id)];
      const moved = await hadHistory(q, missingUserCouponId);
      const said = sentence('REFUND_REPLACEMENT_MISSING', { refundNo: r.refund_no, missingUserCouponId, userId: r.user_id });
      findings.push({
        type: 'REFUND_REPLACEMENT_MISSING',
        couponId: String(r.coupon_id),
        userCouponId: String(r.user_coupon_id),
        redemptionId: String(r.redemption_id),
        details: {
          refundId,
          refundNo: r.refund_no,
          orderNo: r.order_no,
          userId: r.user_id,
          missingUserCouponId,
          ...explained(said, sentence(moved ? 'REPLACEMENT_HAD_HISTORY' : 'RETURN_AGAIN')),
        },
        action: moved ? 'MANUAL_REVIEW' : 'REISSUE_REPLACEMENT',
        params: { refundId, userCouponId: String(r.user_coupon_id), missingUserCouponId },
      });
    }
    return { checked, findings };
  }

  /**
   * Refunds in `range` naming a redemption that is gone, while the order's redemption of the coupon
   * is there under another id: recreated under a new id (before a recreation took the id a refund
   * names), it answered a later refund number as unrefunded, and the order was refunded again. The
   * refund is made to name it; if a second refund already does, the use was refunded twice, for an
   * operator. (With no redemption of the order left, the coupon's audit recreates it under the id
   * the refund names.)
   */
  private async refundsOfLostRedemptions(q: Queryable, range: string[]): Promise<RefundRedemptionFinding[]> {
    const rows: {
      id: string;
      refund_no: string;
      order_no: string;
      user_coupon_id: string;
      coupon_id: string;
      missing_id: string;
      redemption_id: string;
      other_id: string | null;
      other_no: string | null;
    }[] = await q.query(
      // STRAIGHT_JOIN: the refunds whose redemption is gone first, then the rest for those only (as above).
      `SELECT STRAIGHT_JOIN f.id, f.refund_no, f.order_no, f.user_coupon_id, uc.coupon_id, f.redemption_id AS missing_id, r2.id AS redemption_id,
              o.id AS other_id, o.refund_no AS other_no
       FROM refund f
       LEFT JOIN redemption r ON r.id = f.redemption_id
       JOIN user_coupon uc ON uc.id = f.user_coupon_id
       JOIN redemption r2 ON r2.order_no = f.order_no AND r2.user_coupon_id = f.user_coupon_id
       LEFT JOIN refund o ON o.redemption_id = r2.id
       WHERE f.id BETWEEN ? AND ? AND r.id IS NULL ORDER BY f.id`,
      range,
    );
    return rows.map((r) => {
      const [refundId, missingRedemptionId, redemptionId] = [String(r.id), String(r.missing_id), String(r.redemption_id)];
      const said = sentence('REFUND_REDEMPTION_MISSING', { refundNo: r.refund_no, missingRedemptionId, redemptionId });
      return {
        type: 'REFUND_REDEMPTION_MISSING',
        couponId: String(r.coupon_id),
        userCouponId: String(r.user_coupon_id),
        redemptionId,
        details: {
          refundId,
          refundNo: r.refund_no,
          orderNo: r.order_no,
          missingRedemptionId,
          otherRefundId: r.other_id === null ? null : String(r.other_id),
          ...explained(said, r.other_no === null ? sentence('REPOINT_REFUND') : sentence('REFUNDED_TWICE', { otherRefundNo: r.other_no })),
        },
        action: r.other_id === null ? 'REPOINT_REFUND' : 'MANUAL_REVIEW',
        params: { refundId, missingRedemptionId, redemptionId },
      };
    });
  }

  /**
   * USED redemptions with `by` (their id, or their user coupon's) in [lo, hi] whose user coupon row is
   * gone (the other half of REDEMPTION_WITHOUT_USED is in userCouponChunk), or that took more off than their template's
   * rule gives on the amount they name (discount.ts's discountFor, in SQL, without the threshold: a
   * stacked coupon is cut below it, and a repair that did not know the amount records one under it).
   * Templates' rules never change once created. In DECIMAL: a percent of an amount edited near the
   * column's limit overflowed BIGINT and failed the whole run. A repair of a lost use of unknown
   * amount recorded, in earlier versions, a capped PERCENT's cap as both amount and discount, which is
   * above the rule on that amount: that signature is no finding (the discount is the rule's most).
   * Matched with <=>: an uncapped PERCENT's NULL cap made `=` NULL, and NOT NULL dropped all its rows.
   * A run reads them by user coupon, with the user-coupon chunk whose rows it has just read: by
   * redemption id, the lookups of their coupons read the user coupon table a second time, from disk
   * once it outgrows the buffer pool (BENCHMARKS.md).
   */
  async redemptionFindings(
    q: Queryable,
    by: 'id' | 'user_coupon_id',
    lo: bigint,
    hi: bigint,
    /** Coupon ids whose chunks read these redemptions already: left out. */
    readWith: { min: bigint; max: bigint } | null = null,
  ): Promise<(OrphanRedemptionFinding | RedemptionDiscountFinding)[]> {
    const skip = readWith ? 'AND NOT (r.user_coupon_id BETWEEN ? AND ?)' : '';
    const rows: {
      id: string;
      user_coupon_id: string;
      order_no: string;
      user_id: string;
      found: string | null;
      coupon_id: string | null;
      order_amount_cents: string;
      discount_cents: string;
      rule_cents: string | null;
    }[] = await q.query(
      `SELECT * FROM (
         SELECT r.id, r.user_coupon_id, r.order_no, r.user_id, uc.id AS found, uc.coupon_id, r.order_amount_cents, r.discount_cents,
                CASE WHEN BINARY c.discount_type = 'PERCENT'
                     THEN LEAST(FLOOR(CAST(r.order_amount_cents AS DECIMAL(30, 0)) * c.percent_off / 100), COALESCE(c.max_discount_cents, r.order_amount_cents), r.order_amount_cents)
                     ELSE LEAST(c.discount_cents, r.order_amount_cents) END AS rule_cents,
                BINARY c.discount_type = 'PERCENT' AND r.discount_cents <=> c.max_discount_cents AND r.order_amount_cents <=> c.max_discount_cents AS old_repair
         FROM redemption r LEFT JOIN user_coupon uc ON uc.id = r.user_coupon_id LEFT JOIN coupon c ON c.id = uc.coupon_id
         WHERE r.${by} BETWEEN ? AND ? AND r.status = 'USED' ${skip}
       ) x
       WHERE found IS NULL OR (discount_cents > rule_cents AND NOT old_repair) ORDER BY id`,
      [String(lo), String(hi), ...(readWith ? [String(readWith.min), String(readWith.max)] : [])],
    );
    return rows.map((r): OrphanRedemptionFinding | RedemptionDiscountFinding => {
      const params = { redemptionId: r.id, userCouponId: r.user_coupon_id };
      if (r.found === null) {
        return {
          type: 'REDEMPTION_WITHOUT_USED',
          couponId: null,
          userCouponId: r.user_coupon_id,
          redemptionId: r.id,
          details: { orderNo: r.order_no, userId: r.user_id, ...explained(sentence('REDEMPTION_COUPON_GONE')) },
          action: 'MANUAL_REVIEW',
          params,
        };
      }
      const amounts = {
        orderAmountCents: Number(r.order_amount_cents),
        discountCents: Number(r.discount_cents),
        ruleDiscountCents: Number(r.rule_cents),
      };
      return {
        type: 'REDEMPTION_DISCOUNT_EXCEEDED',
        couponId: String(r.coupon_id),
        userCouponId: r.user_coupon_id,
        redemptionId: r.id,
        details: {
          orderNo: r.order_no,
          userId: r.user_id,
          ...amounts,
          ...explained(sentence('REDEMPTION_DISCOUNT_EXCEEDED', { orderNo: r.order_no, ...amounts })),
        },
        action: 'MANUAL_REVIEW',
        params,
      };
    });
  }

  /** The redemptions with ids in [lo, hi], counted and summed for the run's totals; their findings come by user coupon (redemptionFindings). */
  async redemptionChunk(q: Queryable, lo: bigint, hi: bigint): Promise<ChunkResult> {
    const range = [String(lo), String(hi)];
    const [sums]: { n: string; used: string; discount: string; refunded: string; refunded_discount: string }[] = await q.query(
      `SELECT COUNT(*) AS n, COALESCE(SUM(BINARY r.status = 'USED'), 0) AS used,
              COALESCE(SUM(CASE WHEN BINARY r.status = 'USED' THEN r.discount_cents END), 0) AS discount,
              COALESCE(SUM(BINARY r.status = 'USED' AND f.id IS NOT NULL), 0) AS refunded,
              COALESCE(SUM(CASE WHEN BINARY r.status = 'USED' AND f.id IS NOT NULL THEN r.discount_cents END), 0) AS refunded_discount
       FROM redemption r LEFT JOIN refund f ON f.redemption_id = r.id WHERE r.id BETWEEN ? AND ?`,
      range,
    );
    const uses: Uses = {
      redemptions: Number(sums.used),
      discountCents: Number(sums.discount),
      refundedRedemptions: Number(sums.refunded),
      refundedDiscountCents: Number(sums.refunded_discount),
    };
    return { checked: Number(sums.n), findings: [], uses };
  }
}
