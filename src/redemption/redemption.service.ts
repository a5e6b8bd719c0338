import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { EntityManager, Repository } from 'typeorm';
import type { Principal } from '../auth/principal.js';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { counter } from '../common/metrics.js';
import { validationFailed } from '../common/validation.js';
import { Coupon } from '../coupon/coupon.entity.js';
import { IssueService } from '../ledger/issue.service.js';
import { effectiveStatus, toUserCouponView, UserCoupon } from '../ledger/user-coupon.entity.js';
import { findUserCoupon, lockUserCoupon } from '../ledger/user-coupons.js';
import { TransactionService } from '../database/transaction.service.js';
import { StateMachineService } from '../ledger/state-machine.service.js';
import { TxIds } from '../ledger/tx-id.js';
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
    replacementUserCoupon: replacement ? toUserCouponView(replacement) : null,
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

const notFound = () => new AppError('USER_COUPON_NOT_FOUND', 'No such coupon for this user');

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
  ) {}

  redeem(principal: Principal, dto: RedeemDto): Promise<{ redemption: Redemption; firstUse: boolean }> {
    return measured(
      'redeem',
      () => this.doRedeem(this.actingFor(principal, dto.userId), dto),
      (r) => (r.firstUse ? 'USED' : 'REPLAYED'),
    );
  }

  /** A service acts for the user it names; a user only for themself. */
  private actingFor(principal: Principal, userId: string | undefined): string {
    if (principal.roles.includes('service')) {
      if (!userId) throw validationFailed({ userId: ['required with a service token'] });
      return userId;
    }
    if (userId !== undefined && userId !== principal.userId) throw new AppError('FORBIDDEN', 'A user may only redeem their own coupons');
    return principal.userId;
  }

  private async doRedeem(userId: string, dto: RedeemDto): Promise<{ redemption: Redemption; firstUse: boolean }> {
    const earlier = await this.redemptions.findOneBy({ orderNo: dto.orderNo, userCouponId: dto.userCouponId });
    if (earlier) return this.replayRedemption(earlier, userId, dto);
    return this.tx.inTransaction(async (em) => {
      const uc = await lockUserCoupon(em, dto.userCouponId, 'exclusive');
      if (!uc || uc.userId !== userId) throw notFound();
      if (uc.status === 'USED') {
        const mine = await em.findOneBy(Redemption, { orderNo: dto.orderNo, userCouponId: uc.id });
        if (mine) return this.replayRedemption(mine, userId, dto);
        throw new AppError('COUPON_ALREADY_USED', 'This coupon was used on another order');
      }
      const now = new Date();
      const status = effectiveStatus(uc, now);
      if (status === 'VOID') throw new AppError('COUPON_VOID', 'This coupon was voided');
      if (status === 'EXPIRED') throw new AppError('COUPON_EXPIRED', 'This coupon has expired', { expiresAt: uc.expiresAt.toISOString() });
      if (uc.validFrom > now)
        throw new AppError('COUPON_NOT_YET_VALID', 'This coupon is not valid yet', { validFrom: uc.validFrom.toISOString() });
      const coupon = await em.findOneByOrFail(Coupon, { id: uc.couponId });
      if (dto.orderAmountCents < coupon.thresholdCents) {
        throw new AppError('THRESHOLD_NOT_MET', `Orders from ${coupon.thresholdCents} cents qualify`, {
          thresholdCents: coupon.thresholdCents,
        });
      }
      const redemption = Object.assign(new Redemption(), {
        userCouponId: uc.id,
        orderNo: dto.orderNo,
        userId,
        orderAmountCents: dto.orderAmountCents,
        discountCents: Math.min(coupon.discountCents, dto.orderAmountCents),
        status: 'USED' as const,
        usedAt: now,
      });
      await em.insert(Redemption, redemption);
      // The driver hands back the generated id as a number; the API's ids are strings.
      redemption.id = String(redemption.id);
      await this.stateMachine.transit(em, uc.id, 'UNUSED', 'USED', TxIds.order(dto.orderNo), 'redeemed', now);
      return { redemption, firstUse: true };
    });
  }

  /** A repeat is the same request again: asking another amount under the same key is a client bug, not a replay. */
  private replayRedemption(r: Redemption, userId: string, dto: RedeemDto): { redemption: Redemption; firstUse: boolean } {
    if (r.userId !== userId) throw notFound();
    if (r.orderAmountCents !== dto.orderAmountCents) {
      throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This (orderNo, userCouponId) was redeemed with another orderAmountCents', {
        orderAmountCents: r.orderAmountCents,
      });
    }
    return { redemption: r, firstUse: false };
  }

  refund(dto: RefundDto): Promise<{ refund: Refund; replacement: UserCoupon | null; replayed: boolean }> {
    return measured(
      'refund',
      () => this.doRefund(dto),
      (r) => (r.replayed ? 'REPLAYED' : 'REFUNDED'),
    );
  }

  private async doRefund(dto: RefundDto): Promise<{ refund: Refund; replacement: UserCoupon | null; replayed: boolean }> {
    const earlier = await this.refunds.findOneBy({ refundNo: dto.refundNo });
    if (earlier) return this.replayRefund(earlier, dto);
    try {
      return await this.refundOnce(dto);
    } catch (err) {
      // The same refundNo committed meanwhile, for this coupon (answer it) or another (422).
      const winner = isDuplicateKey(err) ? await this.refunds.findOneBy({ refundNo: dto.refundNo }) : null;
      if (winner) return this.replayRefund(winner, dto);
      throw err;
    }
  }

  private refundOnce(dto: RefundDto): Promise<{ refund: Refund; replacement: UserCoupon | null; replayed: boolean }> {
    return this.tx.inTransaction(async (em) => {
      const uc = await lockUserCoupon(em, dto.userCouponId, 'exclusive');
      if (!uc) throw notFound();
      const redemption = await em.findOneBy(Redemption, { orderNo: dto.orderNo, userCouponId: uc.id });
      if (!redemption) throw new AppError('NOT_REDEEMED', 'This coupon was not redeemed on this order');
      const sameRedemption = await em.findOneBy(Refund, { redemptionId: redemption.id });
      if (sameRedemption) return this.replayRefund(sameRedemption, dto, em);
      const coupon = await em.findOneByOrFail(Coupon, { id: uc.couponId });
      if (!coupon.returnOnRefund) throw new AppError('REFUND_RETURN_DISABLED', 'This coupon is not returned on refund');
      const replacement = await this.issuer.issue(em, {
        coupon,
        userId: uc.userId,
        source: 'REFUND_RETURN',
        fromStock: false,
        replacesUserCouponId: uc.id,
        reason: `refund ${dto.refundNo}`,
        txId: TxIds.refund(dto.refundNo),
      });
      const refund = Object.assign(new Refund(), {
        refundNo: dto.refundNo,
        redemptionId: redemption.id,
        userCouponId: uc.id,
        orderNo: dto.orderNo,
        replacementUserCouponId: replacement.id,
        createdAt: new Date(),
      });
      await em.insert(Refund, refund);
      refund.id = String(refund.id);
      return { refund, replacement, replayed: false };
    });
  }

  /** The refund already recorded for this refundNo, or for this redemption under another refundNo. */
  private async replayRefund(r: Refund, dto: RefundDto, em: EntityManager = this.refunds.manager) {
    if (r.refundNo === dto.refundNo && (r.userCouponId !== dto.userCouponId || r.orderNo !== dto.orderNo)) {
      throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This refundNo was already used for another order or coupon');
    }
    const replacement = r.replacementUserCouponId ? await findUserCoupon(em, r.replacementUserCouponId) : null;
    return { refund: r, replacement, replayed: true };
  }
}
