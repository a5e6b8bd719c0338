import { isDeepStrictEqual } from 'node:util';
import { Injectable, Logger } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { EntityManager, FindOptionsWhere, MoreThan, Repository } from 'typeorm';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { Coupon } from '../coupon/coupon.entity.js';
import { discountFor, discountOf } from '../coupon/discount.js';
import { counter } from '../common/metrics.js';
import { Page, toPage } from '../common/page.js';
import { execute, readSnapshot, TransactionService } from '../database/transaction.service.js';
import { IssueService, validityWindow } from '../ledger/issue.service.js';
import { StateMachineService } from '../ledger/state-machine.service.js';
import { findLog, removeLogRows, writeLog } from '../ledger/state-log.js';
import { StockService } from '../ledger/stock.service.js';
import { TxIds } from '../ledger/tx-id.js';
import { countFromStock, findReplacement, lockUserCoupon, setLockedUntil, setStatus } from '../ledger/user-coupons.js';
import { hadHistory, loadUserCouponFacts, type RefundRedemptionFinding, type RefundReplacementFinding } from './audit.service.js';
import { Compensation, CompensationStatus, CompensationView, NOTHING_DONE, toCompensationView } from './compensation.entity.js';
import type { MissingStockFinding, RepairParams, RepairStep, StockFinding } from './diagnosis.js';
import {
  orderRowAudit,
  type HoldLockUntilFinding,
  type HoldWithoutLockedFinding,
  type LockedWithoutHoldFinding,
  type OrderNotRefundedFinding,
  type OrderRowFinding,
  type OrderRowMissingFinding,
} from './hold-audit.js';
import { closeHoldForReconciliation, releasedTo, releaseHoldsOfRefundedOrder } from '../redemption/holds.js';
import { insertOrder, lockOrderStripe, setOrderRefunded } from '../redemption/order.js';

const decided = counter('reconciliation_compensations_decided_total', 'Compensations decided by an admin', ['action', 'decision']);

const sameIds = (a: readonly string[], b: readonly string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

function changedSinceRun(what: string, details: Record<string, unknown>): AppError {
  return new AppError(
    'STATUS_CONFLICT',
    `${what} changed since the run that proposed this compensation; reject it and run reconciliation again`,
    details,
  );
}

/**
 * Admin decisions on proposed compensations. Approval claims the PENDING row with a conditional
 * UPDATE, re-checks under row locks that the data is still what the run saw, performs the action
 * and closes the discrepancy, all in one transaction: if anything fails nothing is changed.
 */
@Injectable()
export class CompensationService {
  private readonly logger = new Logger('Compensation');

  constructor(
    private readonly tx: TransactionService,
    private readonly stock: StockService,
    private readonly stateMachine: StateMachineService,
    private readonly issuer: IssueService,
    @InjectRepository(Compensation) private readonly compensations: Repository<Compensation>,
  ) {}

  async list(filter: { status?: CompensationStatus; runId?: string }, limit: number, cursor?: string): Promise<Page<CompensationView>> {
    const where: FindOptionsWhere<Compensation> = {};
    if (filter.status) where.status = filter.status;
    if (cursor) where.id = MoreThan(cursor);
    if (filter.runId) where.discrepancy = { runId: filter.runId };
    // With a join and `take`, TypeORM reads the page's ids, then their rows: in one snapshot, so a
    // compensation decided in between is not missing from a status-filtered page that then ends early.
    const rows = await readSnapshot(this.compensations.manager.connection, (em) =>
      em.find(Compensation, { where, relations: { discrepancy: true }, order: { id: 'ASC' }, take: limit + 1 }),
    );
    return toPage(rows, limit, toCompensationView);
  }

  async decide(id: string, approve: boolean, adminId: string, reason: string): Promise<CompensationView> {
    const view = await this.tx.inTransaction(async (em) => {
      const claimed = await execute(
        em,
        `UPDATE compensation SET status = ?, decided_by = ?, decision_reason = ? WHERE id = ? AND status = 'PENDING'`,
        [approve ? 'DONE' : 'REJECTED', adminId, reason, id],
      );
      if (claimed !== 1) {
        const [row]: { status: string }[] = await em.query(`SELECT status FROM compensation WHERE id = ?`, [id]);
        if (!row) throw new AppError('COMPENSATION_NOT_FOUND', `No compensation ${id}`, { id });
        throw new AppError('COMPENSATION_ALREADY_DECIDED', `Compensation ${id} is already ${row.status}`, { id, status: row.status });
      }
      const comp = await em.getRepository(Compensation).findOneOrFail({ where: { id }, relations: { discrepancy: true } });
      const result = approve ? await this.perform(em, comp) : { done: NOTHING_DONE.rejected };
      // Decided once performed: the action may have waited for its rows' locks.
      await em.query(`UPDATE compensation SET result = ?, decided_at = ? WHERE id = ?`, [JSON.stringify(result), new Date(), id]);
      // Decided either way: a later run may report the entity again if it is still (or again) inconsistent.
      await em.query(`UPDATE discrepancy SET open_key = NULL WHERE id = ?`, [comp.discrepancyId]);
      return toCompensationView(await em.getRepository(Compensation).findOneOrFail({ where: { id }, relations: { discrepancy: true } }));
    });
    decided.inc({ action: view.action, decision: approve ? 'approved' : 'rejected' });
    this.logger.log(`Compensation ${id} (${view.action}) ${approve ? 'approved' : 'rejected'} by ${adminId}`);
    return view;
  }

  /** Each action reads the clock once it holds its rows' locks: a wait for them may have outlasted a validity or a hold. */
  private async perform(em: EntityManager, comp: Compensation): Promise<Record<string, unknown>> {
    switch (comp.action) {
      case 'RESTORE_STOCK':
      case 'REMOVE_STOCK':
      case 'ADOPT_ISSUED':
        return this.fixStock(em, comp, JSON.parse(comp.params) as StockFinding['params']);
      case 'RECREATE_STOCK':
        return this.recreateStock(em, JSON.parse(comp.params) as MissingStockFinding['params']);
      case 'MARK_CONSISTENT':
        return this.repair(em, comp, JSON.parse(comp.params) as RepairParams);
      case 'RELEASE_COUPON':
        return this.releaseCoupon(em, comp, JSON.parse(comp.params) as LockedWithoutHoldFinding['params']);
      case 'CLOSE_HOLD':
        return this.closeHold(em, JSON.parse(comp.params) as HoldWithoutLockedFinding['params']);
      case 'SET_LOCKED_UNTIL':
        return this.setLockUntil(em, JSON.parse(comp.params) as HoldLockUntilFinding['params']);
      case 'REISSUE_REPLACEMENT':
        return this.reissueReplacement(em, comp, JSON.parse(comp.params) as RefundReplacementFinding['params']);
      case 'REPOINT_REFUND':
        return this.repointRefund(em, JSON.parse(comp.params) as RefundRedemptionFinding['params']);
      case 'RECREATE_ORDER':
        return this.recreateOrder(em, JSON.parse(comp.params) as OrderRowMissingFinding['params']);
      case 'MARK_ORDER_REFUNDED':
        return this.markOrderRefunded(em, comp, JSON.parse(comp.params) as OrderNotRefundedFinding['params']);
      case 'MANUAL_REVIEW':
        return { done: NOTHING_DONE.reviewed };
    }
  }

  /** LOCKED with no ACTIVE hold, still: back to UNUSED (or EXPIRED past its validity) through the state machine. */
  private async releaseCoupon(
    em: EntityManager,
    comp: Compensation,
    p: LockedWithoutHoldFinding['params'],
  ): Promise<Record<string, unknown>> {
    const uc = await lockUserCoupon(em, p.userCouponId, 'exclusive');
    const [active]: { id: string }[] = await em.query(
      `SELECT id FROM redemption_hold WHERE user_coupon_id = ? AND status = 'ACTIVE' LIMIT 1 FOR UPDATE`,
      [p.userCouponId],
    );
    if (uc?.status !== 'LOCKED' || active) {
      throw changedSinceRun(`User coupon ${p.userCouponId}`, { status: uc?.status ?? null, activeHoldId: active?.id ?? null });
    }
    const now = new Date();
    // The move is logged from LOCKED: from any other last step it would break the log's replay (invariant 5).
    const logged = (await findLog(em, p.userCouponId)).at(-1)?.toStatus ?? null;
    if (logged !== 'LOCKED') {
      throw new AppError(
        'STATUS_CONFLICT',
        `User coupon ${p.userCouponId} is LOCKED but its state log ends in ${logged ?? 'nothing'}: the status is what is wrong, which a LOG_MISMATCH repair sets back; reject this compensation and run reconciliation again`,
        { userCouponId: p.userCouponId, status: 'LOCKED', loggedStatus: logged },
      );
    }
    const to = releasedTo(uc, now);
    await this.stateMachine.transit(
      em,
      p.userCouponId,
      'LOCKED',
      to,
      TxIds.compensation(comp.id),
      `reconciliation: compensation ${comp.id} (LOCKED_WITHOUT_HOLD)`,
      now,
    );
    return { done: 'RELEASE_COUPON', userCouponId: p.userCouponId, from: 'LOCKED', to };
  }

  /** An ACTIVE hold its coupon is not LOCKED for, still: CONFIRMED if the order used the coupon, else RELEASED (RECONCILIATION). */
  private async closeHold(em: EntityManager, p: HoldWithoutLockedFinding['params']): Promise<Record<string, unknown>> {
    const uc = await lockUserCoupon(em, p.userCouponId, 'exclusive');
    const [hold]: { status: string }[] = await em.query(`SELECT status FROM redemption_hold WHERE id = ? FOR UPDATE`, [p.holdId]);
    if (hold?.status !== 'ACTIVE' || (uc?.status ?? null) !== p.expectStatus) {
      throw changedSinceRun(`Hold ${p.holdId}`, { holdStatus: hold?.status ?? null, userCouponStatus: uc?.status ?? null });
    }
    await closeHoldForReconciliation(em, p.holdId, p.closeAs, new Date());
    return { done: 'CLOSE_HOLD', holdId: p.holdId, to: p.closeAs };
  }

  /**
   * The refund's returned coupon again, as the refund issued it: source REFUND_RETURN, not from
   * stock, replacing the refunded coupon, issued at the refund's time (so valid as long as the lost
   * one was), and the refund names it. Past that validity it names none, as a refund made then
   * would: a coupon born EXPIRED is worth nothing. Only for a lost coupon that never moved on from
   * UNUSED (hadHistory): else returning another would give the user a second use.
   */
  private async reissueReplacement(
    em: EntityManager,
    comp: Compensation,
    p: RefundReplacementFinding['params'],
  ): Promise<Record<string, unknown>> {
    const uc = await lockUserCoupon(em, p.userCouponId, 'exclusive');
    const [refund]: { refund_no: string; replacement_user_coupon_id: string | null; created_at: Date }[] = await em.query(
      `SELECT refund_no, replacement_user_coupon_id, created_at FROM refund WHERE id = ? FOR UPDATE`,
      [p.refundId],
    );
    const replacement = await findReplacement(em, p.userCouponId);
    const lost = await lockUserCoupon(em, p.missingUserCouponId, 'exclusive');
    if (
      !uc ||
      !refund ||
      String(refund.replacement_user_coupon_id) !== p.missingUserCouponId ||
      replacement !== null ||
      lost !== null ||
      (await hadHistory(em, p.missingUserCouponId))
    ) {
      throw changedSinceRun(`Refund ${p.refundId}`, {
        replacementUserCouponId: refund?.replacement_user_coupon_id ?? null,
        existingReplacementId: replacement,
      });
    }
    const coupon = await em.findOneByOrFail(Coupon, { id: uc.couponId });
    const issued =
      validityWindow(coupon, refund.created_at).expiresAt <= new Date()
        ? null
        : await this.issuer.issueRefundReturn(em, coupon, uc, {
            reason: `reconciliation: compensation ${comp.id} (refund ${refund.refund_no})`,
            txId: TxIds.compensation(comp.id),
            now: refund.created_at,
          });
    await em.query(`UPDATE refund SET replacement_user_coupon_id = ? WHERE id = ?`, [issued?.id ?? null, p.refundId]);
    return {
      done: 'REISSUE_REPLACEMENT',
      refundId: p.refundId,
      replaced: p.missingUserCouponId,
      replacementUserCouponId: issued?.id ?? null,
    };
  }

  /** The refund names the order's redemption of the coupon again; refused if that, the refund, or another refund of it moved since the run. */
  private async repointRefund(em: EntityManager, p: RefundRedemptionFinding['params']): Promise<Record<string, unknown>> {
    const [refund]: { user_coupon_id: string; order_no: string; redemption_id: string }[] = await em.query(
      `SELECT user_coupon_id, order_no, redemption_id FROM refund WHERE id = ?`,
      [p.refundId],
    );
    // The coupon first, as a refund locks it before it reads the redemption and writes the refund.
    if (refund) await lockUserCoupon(em, refund.user_coupon_id, 'exclusive');
    const [now]: { redemption_id: string }[] = await em.query(`SELECT redemption_id FROM refund WHERE id = ? FOR UPDATE`, [p.refundId]);
    const [redemption]: { id: string }[] = refund
      ? await em.query(`SELECT id FROM redemption WHERE order_no = ? AND user_coupon_id = ? FOR UPDATE`, [
          refund.order_no,
          refund.user_coupon_id,
        ])
      : [];
    const [other]: { id: string }[] = await em.query(`SELECT id FROM refund WHERE redemption_id = ? FOR UPDATE`, [p.redemptionId]);
    const [missing]: { id: string }[] = await em.query(`SELECT id FROM redemption WHERE id = ?`, [p.missingRedemptionId]);
    if (!now || String(now.redemption_id) !== p.missingRedemptionId || String(redemption?.id) !== p.redemptionId || other || missing) {
      throw changedSinceRun(`Refund ${p.refundId}`, { redemptionId: now?.redemption_id ?? null, otherRefundId: other?.id ?? null });
    }
    await em.query(`UPDATE refund SET redemption_id = ? WHERE id = ?`, [p.redemptionId, p.refundId]);
    return { done: 'REPOINT_REFUND', refundId: p.refundId, from: p.missingRedemptionId, to: p.redemptionId };
  }

  /** The coupon's lock back to its live hold's end; refused if the coupon, its lock's time or the hold moved since the run. */
  private async setLockUntil(em: EntityManager, p: HoldLockUntilFinding['params']): Promise<Record<string, unknown>> {
    const uc = await lockUserCoupon(em, p.userCouponId, 'exclusive');
    const [hold]: { status: string; expires_at: Date }[] = await em.query(
      `SELECT status, expires_at FROM redemption_hold WHERE id = ? FOR UPDATE`,
      [p.holdId],
    );
    const lockedUntil = uc?.lockedUntil?.toISOString() ?? null;
    if (
      hold?.status !== 'ACTIVE' ||
      hold.expires_at.toISOString() !== p.lockedUntil ||
      uc?.status !== 'LOCKED' ||
      lockedUntil !== p.expectLockedUntil
    ) {
      throw changedSinceRun(`User coupon ${p.userCouponId}`, { status: uc?.status ?? null, lockedUntil, holdStatus: hold?.status ?? null });
    }
    await setLockedUntil(em, p.userCouponId, hold.expires_at);
    return { done: 'SET_LOCKED_UNTIL', userCouponId: p.userCouponId, holdId: p.holdId, from: lockedUntil, to: p.lockedUntil };
  }

  private async fixStock(em: EntityManager, comp: Compensation, p: StockFinding['params']): Promise<Record<string, unknown>> {
    // The stock row lock holds grabs back, and every grab that deducted before it has committed its coupon too, so the count below is exact.
    const row = await this.stock.lock(em, p.couponId);
    const now = new Date();
    const issued = await countFromStock(em, p.couponId);
    const difference = row ? row.initStock - row.stock - issued : null;
    if (!row || difference !== p.difference)
      throw changedSinceRun(`The stock of coupon ${p.couponId}`, { expectedDifference: p.difference, difference });
    if (comp.action === 'ADOPT_ISSUED') {
      // Grabs since the run only lower the stock; units added since (an admin's stock change) would be
      // wiped out by ending the sale, and may now leave room to take the excess off instead.
      if (row.stock > p.stock) throw changedSinceRun(`The stock of coupon ${p.couponId}`, { expectedStock: p.stock, stock: row.stock });
      await this.stock.adopt(em, p.couponId, issued, now);
      return { done: comp.action, couponId: p.couponId, initStock: issued, stock: 0 };
    }
    if (comp.action === 'RESTORE_STOCK') {
      await this.stock.restore(em, p.couponId, p.count, now);
    } else if (!(await this.stock.deduct(em, p.couponId, p.count, now))) {
      throw new AppError('INSUFFICIENT_STOCK', `Only ${row.stock} unit(s) remain, fewer than the ${p.count} to remove`, {
        couponId: p.couponId,
        stock: row.stock,
      });
    }
    return { done: comp.action, couponId: p.couponId, count: p.count };
  }

  private async recreateStock(em: EntityManager, p: MissingStockFinding['params']): Promise<Record<string, unknown>> {
    // Nothing issues from stock while the row is missing, so the count is exact; a row that came back meanwhile (by hand) is a change since the run.
    const changed = () => changedSinceRun(`The stock of coupon ${p.couponId}`, { couponId: p.couponId });
    if (await this.stock.lock(em, p.couponId)) throw changed();
    const issued = await countFromStock(em, p.couponId);
    try {
      await this.stock.recreate(em, p.couponId, issued, new Date());
    } catch (err) {
      if (isDuplicateKey(err)) throw changed();
      throw err;
    }
    return { done: 'RECREATE_STOCK', couponId: p.couponId, initStock: issued, stock: 0 };
  }

  /**
   * An order's row repair takes the order's lock, which each of its holds, redemptions and refunds
   * takes first, so none changes meanwhile; the order's audit, read again, must propose the same
   * repair. Anything else (a hold timed out, a refund made, the row written, lost or set right since
   * the run) is a change since the run, as a stock row back is.
   */
  private async orderAuditedAgain(
    em: EntityManager,
    action: OrderRowFinding['action'],
    p: OrderRowFinding['params'],
  ): Promise<OrderRowFinding> {
    await lockOrderStripe(em, p.orderNo);
    const [again] = await orderRowAudit(em, p.orderNo, new Date());
    if (again?.action !== action || !isDeepStrictEqual(again.params, p))
      throw changedSinceRun(`Order ${p.orderNo}`, again?.params ?? { orderNo: p.orderNo });
    return again;
  }

  /** The order's lost row back as the operator approved it. */
  private async recreateOrder(em: EntityManager, p: OrderRowMissingFinding['params']): Promise<Record<string, unknown>> {
    await this.orderAuditedAgain(em, 'RECREATE_ORDER', p);
    if (p.orderAmountCents === null) throw changedSinceRun(`Order ${p.orderNo}`, p);
    const row = { ...p, orderAmountCents: p.orderAmountCents, createdAt: new Date(p.orderCreatedAt) };
    // Written by another node of a cluster since (its stripe lock is local to that node).
    if (!(await insertOrder(em, row))) throw changedSinceRun(`The row of order ${p.orderNo}`, { orderNo: p.orderNo });
    return { done: 'RECREATE_ORDER', ...p };
  }

  /**
   * The order marked refunded, and its live holds released, as its refund did. Its redemptions since
   * the refund are left: money already taken off, which the operator decides about; the result names
   * them as read now, and the holds left ACTIVE because their coupon is not LOCKED for them alone
   * (each its own HOLD_WITHOUT_LOCKED).
   */
  private async markOrderRefunded(
    em: EntityManager,
    comp: Compensation,
    p: OrderNotRefundedFinding['params'],
  ): Promise<Record<string, unknown>> {
    const again = await this.orderAuditedAgain(em, 'MARK_ORDER_REFUNDED', p);
    // Deleted by another node of a cluster since (its stripe lock is local to that node).
    if (!(await setOrderRefunded(em, p.orderNo))) throw changedSinceRun(`The row of order ${p.orderNo}`, { orderNo: p.orderNo });
    const holds = await releaseHoldsOfRefundedOrder(em, this.stateMachine, p.orderNo, `compensation ${comp.id}`);
    const { refundIds, redemptionIds } = (again as OrderNotRefundedFinding).details;
    return {
      done: 'MARK_ORDER_REFUNDED',
      orderNo: p.orderNo,
      refundIds,
      redemptionIds,
      releasedHoldIds: holds.released,
      unreleasedHoldIds: holds.left,
    };
  }

  private async repair(em: EntityManager, comp: Compensation, p: RepairParams): Promise<Record<string, unknown>> {
    await lockUserCoupon(em, p.userCouponId, 'exclusive');
    const [facts] = await loadUserCouponFacts(em, [p.userCouponId]);
    const current = facts && {
      status: facts.status,
      logIds: facts.log.map((l) => l.id),
      usedRedemptionIds: facts.usedRedemptions.map((r) => r.id),
      activeHoldIds: facts.activeHolds.map((h) => h.id),
    };
    if (
      !current ||
      current.status !== p.expect.status ||
      !sameIds(current.logIds, p.expect.logIds) ||
      !sameIds(current.usedRedemptionIds, p.expect.usedRedemptionIds) ||
      (p.expect.activeHoldIds !== undefined && !sameIds(current.activeHoldIds, p.expect.activeHoldIds))
    ) {
      throw changedSinceRun(`User coupon ${p.userCouponId}`, { expected: p.expect, found: current ?? null });
    }
    const txId = TxIds.compensation(comp.id);
    const reason = `reconciliation: compensation ${comp.id} (${comp.discrepancy.type})`;
    const done: Record<string, unknown>[] = [];
    const now = new Date();
    for (const s of p.steps) done.push(await this.repairStep(em, p.userCouponId, s, facts, { txId, reason, now }));
    return { done: 'MARK_CONSISTENT', userCouponId: p.userCouponId, steps: done };
  }

  private async repairStep(
    em: EntityManager,
    userCouponId: string,
    s: RepairStep,
    facts: NonNullable<Awaited<ReturnType<typeof loadUserCouponFacts>>[number]>,
    ctx: { txId: string; reason: string; now: Date },
  ): Promise<Record<string, unknown>> {
    switch (s.op) {
      case 'REMOVE_LOG': {
        // The rows leave the log but not the record: they are kept in this compensation's result.
        const removed = facts.log.filter((l) => s.logIds.includes(l.id));
        await removeLogRows(em, userCouponId, s.logIds);
        return { op: s.op, removed };
      }
      case 'APPEND_LOG': {
        const rows = s.rows.map((r) => ({
          userCouponId,
          from: r.from,
          to: r.to,
          txId: r.txId ?? ctx.txId,
          reason: r.reason ?? ctx.reason,
          at: r.createdAt ? new Date(r.createdAt) : ctx.now,
        }));
        await writeLog(em, rows);
        return { op: s.op, rows };
      }
      case 'SET_STATUS': {
        // Not a lifecycle move (the log already records this status, or is rewritten to in this same repair), so not through transit().
        if ((await setStatus(em, [userCouponId], s.from, s.to, ctx.now)) !== 1)
          throw changedSinceRun(`User coupon ${userCouponId}`, { expectedStatus: s.from });
        // Back to LOCKED for its live hold (the first, as the hold audit keeps): the coupon carries that
        // hold's expiry again, which its timeout and every reader go by, and the hold audit checks.
        const hold = s.to === 'LOCKED' ? facts.activeHolds[0] : undefined;
        if (hold) await setLockedUntil(em, userCouponId, hold.expiresAt);
        return { op: s.op, from: s.from, to: s.to, ...(hold && { lockedUntil: hold.expiresAt.toISOString() }) };
      }
      case 'TRANSIT':
        await this.stateMachine.transit(em, userCouponId, s.from, s.to, s.txId ?? ctx.txId, ctx.reason, ctx.now);
        return { op: s.op, from: s.from, to: s.to };
      case 'RECREATE_REDEMPTION': {
        const { orderAmountCents, discountCents, amountKnown } = await recreatedAmounts(em, userCouponId, facts.couponId, s.orderNo);
        // A refund of the use names the lost row: it comes back under that id, so that the refund
        // answers for it again. Under a new id, a refund with another number refunded the order a
        // second time (and returned the coupon twice).
        const [refunded]: { id: string }[] = await em.query(
          `SELECT f.redemption_id AS id FROM refund f LEFT JOIN redemption r ON r.id = f.redemption_id
           WHERE f.user_coupon_id = ? AND f.order_no = ? AND r.id IS NULL LIMIT 1`,
          [userCouponId, s.orderNo],
        );
        try {
          await em.query(
            `INSERT INTO redemption (id, user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at) VALUES (?, ?, ?, ?, ?, ?, 'USED', ?)`,
            [refunded?.id ?? null, userCouponId, s.orderNo, s.userId, orderAmountCents, discountCents, new Date(s.usedAt)],
          );
        } catch (err) {
          if (isDuplicateKey(err)) throw changedSinceRun(`The redemption of order ${s.orderNo}`, { orderNo: s.orderNo, userCouponId });
          throw err;
        }
        return {
          op: s.op,
          orderNo: s.orderNo,
          orderAmountCents: amountKnown
            ? orderAmountCents
            : `unknown, recorded as ${orderAmountCents}, the smallest order the template's rule takes this discount off`,
          discountCents,
          ...(refunded && { redemptionId: String(refunded.id), refunded: true }),
        };
      }
      case 'RESTORE_REDEMPTION':
        if ((await execute(em, `UPDATE redemption SET status = 'USED' WHERE id = ? AND status = ?`, [s.redemptionId, s.from])) !== 1)
          throw changedSinceRun(`Redemption ${s.redemptionId}`, { expectedStatus: s.from });
        return { op: s.op, redemptionId: s.redemptionId, from: s.from, to: 'USED' };
      case 'CLOSE_HOLDS':
        for (const h of s.holds) {
          // The holds were read under the coupon's row lock, which every hold write takes first: they are still ACTIVE.
          if ((await closeHoldForReconciliation(em, h.holdId, h.closeAs, ctx.now)) !== 1)
            throw changedSinceRun(`Hold ${h.holdId}`, { expectedStatus: 'ACTIVE' });
        }
        return { op: s.op, holds: s.holds };
    }
  }
}

/**
 * The amounts of a lost redemption, as the redemption worked them out: the coupon's hold (for a
 * confirmed one) tells the order's amount and the discount granted; else the order's row tells the
 * amount (the order's may have been repriced since), or the order's other redemptions, which named
 * it too; the discount is the template's rule on it (its threshold was met when the coupon was
 * used), cut to what the order's other coupons leave of it, as stacking cut it. Without any of them
 * the amount is unknown: the most the rule takes off without one (an AMOUNT's amount, a PERCENT's
 * cap, else nothing) is recorded, on the smallest order the rule takes that off (the AMOUNT's
 * amount; the one a PERCENT reaches its cap on), so the order never shows more off than it cost and
 * the discount is the rule's (the audit of redemptions checks it).
 */
async function recreatedAmounts(
  em: EntityManager,
  userCouponId: string,
  couponId: string,
  orderNo: string,
): Promise<{ orderAmountCents: number; discountCents: number; amountKnown: boolean }> {
  const [hold]: { order_amount_cents: string; discount_cents: string }[] = await em.query(
    `SELECT order_amount_cents, discount_cents FROM redemption_hold WHERE order_no = ? AND user_coupon_id = ?`,
    [orderNo, userCouponId],
  );
  if (hold) return { orderAmountCents: Number(hold.order_amount_cents), discountCents: Number(hold.discount_cents), amountKnown: true };
  const rule = discountOf(await em.findOneByOrFail(Coupon, { id: couponId }));
  const [order]: { order_amount_cents: string }[] = await em.query(`SELECT order_amount_cents FROM coupon_order WHERE order_no = ?`, [
    orderNo,
  ]);
  const [others]: { named: string | null; taken: string }[] = await em.query(
    `SELECT MIN(order_amount_cents) AS named, COALESCE(SUM(discount_cents), 0) AS taken FROM redemption
     WHERE order_no = ? AND status = 'USED' AND user_coupon_id <> ?`,
    [orderNo, userCouponId],
  );
  const amount = order ? Number(order.order_amount_cents) : others.named !== null ? Number(others.named) : null;
  if (amount !== null) {
    const room = Math.max(0, amount - Number(others.taken));
    const discountCents = Math.min(discountFor({ ...rule, thresholdCents: 0 }, amount) ?? 0, room);
    return { orderAmountCents: amount, discountCents, amountKnown: true };
  }
  const most = rule.type === 'AMOUNT' ? rule.amountCents : (rule.maxDiscountCents ?? 0);
  // The smallest amount the rule takes that off: a PERCENT reaches its cap only on a larger order.
  const amountForMost =
    rule.type === 'PERCENT' && most > 0 ? Number((BigInt(most) * 100n + BigInt(rule.percentOff) - 1n) / BigInt(rule.percentOff)) : most;
  return { orderAmountCents: amountForMost, discountCents: most, amountKnown: false };
}
