import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { EntityManager, Repository } from 'typeorm';
import type { Principal } from '../auth/principal.js';
import { AppConfig } from '../config/app-config.js';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { counter } from '../common/metrics.js';
import { Coupon } from '../coupon/coupon.entity.js';
import { IssueService, validityEnded } from '../ledger/issue.service.js';
import { toIssuedView, UserCoupon } from '../ledger/user-coupon.entity.js';
import { findReplacement, findUserCoupon, lockUserCoupon } from '../ledger/user-coupons.js';
import { withLookup } from '../database/outcome.js';
import { execute, TransactionService } from '../database/transaction.service.js';
import { StateMachineService } from '../ledger/state-machine.service.js';
import { TxIds } from '../ledger/tx-id.js';
import { orderActor, usableDiscount, userCouponNotFound } from './checks.js';
import { effectiveHold, Hold } from './hold.entity.js';
import { findHold, releaseHoldsOfRefundedOrder, releaseTimedOutHold } from './holds.js';
import { lockOrder, markOrderRefunded, OrderRow, orderDiscount, refuseRefundedOrder } from './order.js';
import { RedeemDto, RefundDto } from './redemption.dto.js';
import { Redemption, Refund } from './redemption.entity.js';

const outcomes = counter('redemption_outcomes_total', 'Redemption and refund answers by result', ['operation', 'result']);

export function toRedemptionView(r: Redemption, firstUse: boolean) {
  return {
    redemptionId: r.id,
    userCouponId: r.userCouponId,
    orderNo: r.orderNo,
    userId: r.userId,
    discountCents: r.discountCents,
    status: r.status,
    usedAt: r.usedAt.toISOString(),
    firstUse,
  };
}
export type RedemptionView = ReturnType<typeof toRedemptionView>;

export function toRefundView(r: Refund, replacement: UserCoupon | null) {
  return {
    refundId: r.id,
    refundNo: r.refundNo,
    userCouponId: r.userCouponId,
    orderNo: r.orderNo,
    replacementUserCoupon: replacement ? toIssuedView(replacement) : null,
    createdAt: r.createdAt.toISOString(),
  };
}
export type RefundView = ReturnType<typeof toRefundView>;

async function measured<T>(operation: string, fn: () => Promise<T>, resultOf: (v: T) => string): Promise<T> {
  try {
    const v = await fn();
    outcomes.inc({ operation, result: resultOf(v) });
    return v;
  } catch (err) {
    outcomes.inc({ operation, result: err instanceof AppError ? err.code : 'ERROR' });
    throw err;
  }
}

/** Repeating the same request is how a client learns what happened to a redemption or refund whose outcome is unknown. */
const repeatToLearn = (key: Record<string, unknown>) => (err: unknown) => {
  throw withLookup(err, { ...key, lookup: 'repeat the same request: it answers the committed result, or does it now' });
};

/** Every number a refund was asked for under, in one table: its primary key is where a number is taken (a duplicate throws). */
function takeRefundNumber(em: EntityManager, refundNo: string, refundId: string): Promise<unknown> {
  return em.query(`INSERT INTO refund_number (refund_no, refund_id) VALUES (?, ?)`, [refundNo, refundId]);
}

/**
 * Using a coupon on an order, and returning it on refund. Both are idempotent by a unique key and
 * run as one transaction that locks the user coupon row first, so repeats and races serialize on it.
 */
@Injectable()
export class RedemptionService {
  constructor(
    @InjectRepository(Redemption) private readonly redemptions: Repository<Redemption>,
    @InjectRepository(Refund) private readonly refunds: Repository<Refund>,
    private readonly tx: TransactionService,
    private readonly stateMachine: StateMachineService,
    private readonly issuer: IssueService,
    private readonly config: AppConfig,
  ) {}

  redeem(principal: Principal, dto: RedeemDto): Promise<{ redemption: Redemption; firstUse: boolean }> {
    return measured(
      'redeem',
      () => this.doRedeem(orderActor(principal, dto.userId, this.config), dto),
      (r) => (r.firstUse ? 'USED' : 'REPLAYED'),
    ).catch(repeatToLearn({ orderNo: dto.orderNo, userCouponId: dto.userCouponId }));
  }

  /**
   * Locks the order, then the user coupon. The pair of a hold confirms it; otherwise the coupon
   * must be usable as every reader sees it (a timed-out hold of another order is released in the
   * same transaction) and the order must take it.
   */
  private async doRedeem(userId: string, dto: RedeemDto): Promise<{ redemption: Redemption; firstUse: boolean }> {
    const earlier = await this.redemptions.findOneBy({ orderNo: dto.orderNo, userCouponId: dto.userCouponId });
    if (earlier) return this.replayRedemption(earlier, userId, dto);
    return this.tx.inTransaction(async (em) => {
      const order = await lockOrder(em, dto.orderNo, dto.orderAmountCents, new Date());
      const uc = await lockUserCoupon(em, dto.userCouponId, 'exclusive');
      // Read once the order and the coupon are locked: a confirmation queued behind a request that
      // found its hold timed out (and put another coupon on the order), or one that got the coupon
      // past the hold's time, must find it timed out too.
      const now = new Date();
      if (!uc || uc.userId !== userId) throw userCouponNotFound();
      if (uc.status === 'USED') {
        const mine = await em.findOneBy(Redemption, { orderNo: dto.orderNo, userCouponId: uc.id });
        if (mine) return this.replayRedemption(mine, userId, dto);
      }
      const hold = await findHold(em, dto.orderNo, uc.id, true);
      if (hold) return { redemption: await this.confirm(em, uc, hold, order, dto, now), firstUse: true };
      const { coupon, discountCents } = await usableDiscount(em, uc, dto.orderAmountCents, now);
      const granted = await orderDiscount(em, order, dto.orderAmountCents, uc, coupon, discountCents, now);
      if (uc.status === 'LOCKED') await releaseTimedOutHold(em, this.stateMachine, uc, now);
      const redemption = await this.insertRedemption(em, uc.id, dto, userId, granted, now);
      await this.stateMachine.transit(em, uc.id, 'UNUSED', 'USED', TxIds.order(dto.orderNo), 'redeemed', now);
      return { redemption, firstUse: true };
    });
  }

  /** A repeat is the same request again: asking another amount under the same key is a client bug, not a replay. */
  private replayRedemption(r: Redemption, userId: string, dto: RedeemDto): { redemption: Redemption; firstUse: boolean } {
    if (r.userId !== userId) throw userCouponNotFound();
    if (r.orderAmountCents !== dto.orderAmountCents) {
      throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This (orderNo, userCouponId) was redeemed with another orderAmountCents', {
        orderAmountCents: r.orderAmountCents,
      });
    }
    return { redemption: r, firstUse: false };
  }

  /**
   * Confirms the hold of this (order, coupon): LOCKED -> USED with the hold's discount. Inside the
   * hold's time the coupon's own validity no longer matters: the customer ordered while it was valid.
   */
  private async confirm(em: EntityManager, uc: UserCoupon, hold: Hold, order: OrderRow, dto: RedeemDto, now: Date): Promise<Redemption> {
    const seen = effectiveHold(hold, now);
    if (seen.status === 'RELEASED') {
      throw seen.releaseReason === 'TIMEOUT'
        ? new AppError('HOLD_EXPIRED', 'The hold for this order timed out', { expiresAt: hold.expiresAt.toISOString() })
        : new AppError('HOLD_RELEASED', 'The hold for this order was released');
    }
    if (seen.status === 'CONFIRMED') throw new AppError('STATUS_CONFLICT', `Hold ${hold.id} is confirmed but its coupon is not USED`);
    if (dto.orderAmountCents !== hold.orderAmountCents) {
      throw new AppError('HOLD_MISMATCH', `The hold was placed for an order of ${hold.orderAmountCents} cents`, {
        orderAmountCents: hold.orderAmountCents,
      });
    }
    refuseRefundedOrder(order);
    const confirmed = await execute(em, `UPDATE redemption_hold SET status = 'CONFIRMED' WHERE id = ? AND status = 'ACTIVE'`, [hold.id]);
    if (confirmed !== 1) throw new AppError('STATUS_CONFLICT', `Hold ${hold.id} is no longer active`, { holdId: hold.id });
    const redemption = await this.insertRedemption(em, uc.id, dto, hold.userId, hold.discountCents, now);
    await this.stateMachine.transit(em, uc.id, 'LOCKED', 'USED', TxIds.order(dto.orderNo), 'hold confirmed', now);
    return redemption;
  }

  private async insertRedemption(
    em: EntityManager,
    userCouponId: string,
    dto: RedeemDto,
    userId: string,
    discountCents: number,
    now: Date,
  ): Promise<Redemption> {
    const redemption = Object.assign(new Redemption(), {
      userCouponId,
      orderNo: dto.orderNo,
      userId,
      orderAmountCents: dto.orderAmountCents,
      discountCents,
      status: 'USED' as const,
      usedAt: now,
    });
    await em.insert(Redemption, redemption);
    // The driver hands back the generated id as a number; the API's ids are strings.
    redemption.id = String(redemption.id);
    return redemption;
  }

  refund(dto: RefundDto): Promise<{ refund: Refund; replacement: UserCoupon | null; replayed: boolean }> {
    return measured(
      'refund',
      () => this.doRefund(dto),
      (r) => (r.replayed ? 'REPLAYED' : 'REFUNDED'),
    ).catch(repeatToLearn({ refundNo: dto.refundNo }));
  }

  private async doRefund(dto: RefundDto): Promise<{ refund: Refund; replacement: UserCoupon | null; replayed: boolean }> {
    const earlier = await this.refundNamed(this.refunds.manager, dto.refundNo);
    if (earlier) return this.replayRefund(earlier, dto);
    try {
      return await this.refundOnce(dto);
    } catch (err) {
      // The same refundNo committed meanwhile, for this coupon (answer it) or another (422).
      const winner = isDuplicateKey(err) ? await this.refundNamed(this.refunds.manager, dto.refundNo) : null;
      if (winner) return this.replayRefund(winner, dto);
      throw err;
    }
  }

  private refundOnce(dto: RefundDto): Promise<{ refund: Refund; replacement: UserCoupon | null; replayed: boolean }> {
    return this.tx.inTransaction(async (em) => {
      // The order first, as every hold and redemption locks it: marked refunded, it takes no new coupon.
      await markOrderRefunded(em, dto.orderNo);
      const uc = await lockUserCoupon(em, dto.userCouponId, 'exclusive');
      // A refund names no user (the order service sends it): the coupon is unknown, not someone else's.
      if (!uc)
        throw new AppError('USER_COUPON_NOT_FOUND', `User coupon ${dto.userCouponId} does not exist`, { userCouponId: dto.userCouponId });
      const redemption = await em.findOneBy(Redemption, { orderNo: dto.orderNo, userCouponId: uc.id });
      if (!redemption) throw new AppError('NOT_REDEEMED', 'This coupon was not redeemed on this order');
      const sameRedemption = await em.findOneBy(Refund, { redemptionId: redemption.id });
      if (sameRedemption) {
        // Answered with that refund, this number names it from now on: it can make no other refund.
        await takeRefundNumber(em, dto.refundNo, sameRedemption.id);
        return this.replayRefund(sameRedemption, dto, em);
      }
      const coupon = await em.findOneByOrFail(Coupon, { id: uc.couponId });
      if (!coupon.returnOnRefund) throw new AppError('REFUND_RETURN_DISABLED', 'This coupon is not returned on refund');
      // Past the template's fixed validity a replacement would be born EXPIRED: the refund is recorded
      // without one, as the Refund's null replacement says. Refused, it left the order unrefunded, still
      // taking coupons, and an order service retrying an ordinary refund for ever (an unlisted 409).
      // Nor is a coupon replaced twice: an operator's reissue may have made it good already.
      const replacement =
        validityEnded(coupon, new Date()) || (await findReplacement(em, uc.id)) !== null
          ? null
          : await this.issuer.issueRefundReturn(em, coupon, uc, { reason: `refund ${dto.refundNo}`, txId: TxIds.refund(dto.refundNo) });
      const refund = Object.assign(new Refund(), {
        refundNo: dto.refundNo,
        redemptionId: redemption.id,
        userCouponId: uc.id,
        orderNo: dto.orderNo,
        replacementUserCouponId: replacement?.id ?? null,
        createdAt: new Date(),
      });
      await em.insert(Refund, refund);
      refund.id = String(refund.id);
      await takeRefundNumber(em, dto.refundNo, refund.id);
      await releaseHoldsOfRefundedOrder(em, this.stateMachine, dto.orderNo, `refund ${dto.refundNo}`);
      return { refund, replacement, replayed: false };
    });
  }

  /**
   * The refund a refund number names: its own, or the one it was answered with (see refundOnce).
   * The refund table is read too: a refund made by an instance older than refund_number (a rolling
   * deploy) has no row there, and its number must still be answered, not be a duplicate key (500).
   */
  private async refundNamed(em: EntityManager, refundNo: string): Promise<Refund | null> {
    const [row] = (await em.query(
      `SELECT refund_id FROM refund_number WHERE refund_no = ? UNION ALL SELECT id FROM refund WHERE refund_no = ? LIMIT 1`,
      [refundNo, refundNo],
    )) as { refund_id: string }[];
    return row ? em.findOneBy(Refund, { id: String(row.refund_id) }) : null;
  }

  /** The refund already recorded for this refundNo, or for this redemption under another refundNo. */
  private async replayRefund(r: Refund, dto: RefundDto, em: EntityManager = this.refunds.manager) {
    if (r.userCouponId !== dto.userCouponId || r.orderNo !== dto.orderNo) {
      throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This refundNo was already used for another order or coupon');
    }
    const replacement = r.replacementUserCouponId ? await findUserCoupon(em, r.replacementUserCouponId) : null;
    return { refund: r, replacement, replayed: true };
  }
}
