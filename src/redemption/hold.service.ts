import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { EntityManager, Repository } from 'typeorm';
import type { Principal } from '../auth/principal.js';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { counter } from '../common/metrics.js';
import { AppConfig } from '../config/app-config.js';
import { TransactionService } from '../database/transaction.service.js';
import { TxIds } from '../ledger/tx-id.js';
import { StateMachineService } from '../ledger/state-machine.service.js';
import { lockUserCoupon, setLockedUntil } from '../ledger/user-coupons.js';
import { orderActor, usableDiscount, userCouponNotFound } from './checks.js';
import { effectiveHold, Hold } from './hold.entity.js';
import { findHold, releasedAt, releaseHold, releaseTimedOutHold } from './holds.js';
import { lockOrder, lockOrderStripe, orderDiscount } from './order.js';
import { HoldDto, ReleaseHoldDto } from './redemption.dto.js';

const outcomes = counter('hold_outcomes_total', 'Checkout hold answers by operation and result', ['operation', 'result']);

async function measured<T extends { replayed: boolean }>(operation: string, fn: () => Promise<T>, done: string): Promise<T> {
  try {
    const v = await fn();
    outcomes.inc({ operation, result: v.replayed ? 'REPLAYED' : done });
    return v;
  } catch (err) {
    outcomes.inc({ operation, result: err instanceof AppError ? err.code : 'ERROR' });
    throw err;
  }
}

const holdNotFound = () => new AppError('HOLD_NOT_FOUND', 'No hold of this coupon for this order');

/**
 * Checkout holds: a coupon locked for one unpaid order (UNUSED -> LOCKED), confirmed by the
 * redemption of the same (order, coupon) (RedemptionService), released on cancel or timeout. Each
 * runs as one transaction that locks the order (its stripe, then, for a hold, its row), then the
 * user coupon row, then the hold, the same order as redemptions, so they serialize without deadlocking.
 */
@Injectable()
export class HoldService {
  constructor(
    @InjectRepository(Hold) private readonly holds: Repository<Hold>,
    private readonly tx: TransactionService,
    private readonly stateMachine: StateMachineService,
    private readonly config: AppConfig,
  ) {}

  hold(principal: Principal, dto: HoldDto): Promise<{ hold: Hold; replayed: boolean }> {
    const userId = orderActor(principal, dto.userId, this.config);
    return measured('hold', () => this.doHold(userId, dto), 'LOCKED');
  }

  private async doHold(userId: string, dto: HoldDto): Promise<{ hold: Hold; replayed: boolean }> {
    const earlier = await this.holds.findOneBy({ orderNo: dto.orderNo, userCouponId: dto.userCouponId });
    if (earlier) return replayHold(earlier, userId, dto);
    try {
      return await this.tx.inTransaction((em) => this.holdOnce(em, userId, dto));
    } catch (err) {
      const winner = isDuplicateKey(err) ? await this.holds.findOneBy({ orderNo: dto.orderNo, userCouponId: dto.userCouponId }) : null;
      if (winner) return replayHold(winner, userId, dto);
      throw err;
    }
  }

  private async holdOnce(em: EntityManager, userId: string, dto: HoldDto): Promise<{ hold: Hold; replayed: boolean }> {
    const order = await lockOrder(em, dto.orderNo, dto.orderAmountCents, new Date());
    const uc = await lockUserCoupon(em, dto.userCouponId, 'exclusive');
    // Read once the rows it decides on are locked: a request queued behind one that found a hold
    // timed out must find it timed out too, and a hold placed after a wait lasts its whole time
    // from then (read before, a 1 s hold that waited 3 s for the coupon was born RELEASED).
    const now = new Date();
    if (!uc || uc.userId !== userId) throw userCouponNotFound();
    const same = await findHold(em, dto.orderNo, uc.id, false);
    if (same) return replayHold(same, userId, dto);
    const { coupon, discountCents } = await usableDiscount(em, uc, dto.orderAmountCents, now);
    const granted = await orderDiscount(em, order, dto.orderAmountCents, uc, coupon, discountCents, now);
    if (uc.status === 'LOCKED') await releaseTimedOutHold(em, this.stateMachine, uc, now);
    const hold = Object.assign(new Hold(), {
      userCouponId: uc.id,
      orderNo: dto.orderNo,
      userId,
      orderAmountCents: dto.orderAmountCents,
      discountCents: granted,
      status: 'ACTIVE' as const,
      expiresAt: new Date(now.getTime() + (dto.ttlSeconds ?? this.config.HOLD_TTL_SECONDS) * 1000),
      createdAt: now,
      releasedAt: null,
      releaseReason: null,
    });
    await em.insert(Hold, hold);
    hold.id = String(hold.id);
    await this.stateMachine.transit(em, uc.id, 'UNUSED', 'LOCKED', TxIds.hold(dto.orderNo), 'held', now);
    await setLockedUntil(em, uc.id, hold.expiresAt);
    return { hold, replayed: false };
  }

  /**
   * Gives the coupon back: hold RELEASED (CANCELLED), coupon LOCKED -> UNUSED, or EXPIRED when its
   * validity ended. A hold already released answers as it is, as a replay when it was cancelled (by
   * a release or its order's refund); one that timed out is answered alike whether or not the sweep
   * stored the timeout first, never as a replay of a request.
   */
  release(principal: Principal, dto: ReleaseHoldDto): Promise<{ hold: Hold; replayed: boolean }> {
    const userId = orderActor(principal, dto.userId, this.config);
    return measured(
      'release',
      () =>
        this.tx.inTransaction(async (em) => {
          // The order first, as a hold locks it: a release sent while the order's hold is still being
          // placed (its answer lost, the order cancelled) waits for it and releases it, rather than
          // answering HOLD_NOT_FOUND and leaving the coupon locked for the cancelled order.
          await lockOrderStripe(em, dto.orderNo);
          const uc = await lockUserCoupon(em, dto.userCouponId, 'exclusive');
          // After the wait for the coupon: a release that gets it past the hold's time finds it timed out.
          const now = new Date();
          const hold = uc && uc.userId === userId ? await findHold(em, dto.orderNo, uc.id, true) : null;
          if (!uc || !hold) throw holdNotFound();
          if (hold.status === 'CONFIRMED') throw new AppError('HOLD_ALREADY_CONFIRMED', 'The order was paid: the coupon is used');
          if (hold.status === 'RELEASED') return { hold, replayed: hold.releaseReason === 'CANCELLED' };
          // Past its time it is released already to every reader; storing that is what the sweep would do.
          const reason = effectiveHold(hold, now).status === 'RELEASED' ? 'TIMEOUT' : 'CANCELLED';
          await releaseHold(em, this.stateMachine, uc, hold, reason, now);
          return {
            hold: Object.assign(hold, { status: 'RELEASED' as const, releasedAt: releasedAt(hold, reason, now), releaseReason: reason }),
            replayed: false,
          };
        }),
      'RELEASED',
    );
  }
}

/** The hold already placed for this (order, coupon), whatever its status, if the repeat asks for the same. */
function replayHold(h: Hold, userId: string, dto: HoldDto): { hold: Hold; replayed: boolean } {
  if (h.userId !== userId) throw userCouponNotFound();
  if (h.orderAmountCents !== dto.orderAmountCents) {
    throw new AppError('IDEMPOTENCY_KEY_REUSED', `This order's hold was placed for ${h.orderAmountCents} cents`, {
      orderAmountCents: h.orderAmountCents,
    });
  }
  return { hold: h, replayed: true };
}
