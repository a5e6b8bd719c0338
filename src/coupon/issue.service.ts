import { Injectable } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { AppError } from '../common/errors.js';
import { writeLog } from '../state-machine/state-machine.service.js';
import { StockService } from '../stock/stock.service.js';
import type { Coupon } from './coupon.entity.js';
import { UserCoupon, UserCouponSource } from './user-coupon.entity.js';

const DAY_MS = 86_400_000;

export interface IssueInput {
  coupon: Pick<Coupon, 'id' | 'validityType' | 'validityStartAt' | 'validityEndAt' | 'validityDays'>;
  userId: string;
  source: UserCouponSource;
  /** Take one unit of stock (grabs, reissues "fromStock"); false for refund returns and stock-neutral reissues. */
  fromStock: boolean;
  idempotencyKey?: string | null;
  replacesUserCouponId?: string | null;
  reason?: string | null;
  /** Written to the state log's tx_id: the idempotency key, order number, refund number or admin action. */
  txId: string;
  now?: Date;
}

export function soldOutError(couponId: string): AppError {
  return new AppError('SOLD_OUT', 'This coupon is sold out', { couponId });
}

export function validityWindow(coupon: IssueInput['coupon'], now: Date): { validFrom: Date; expiresAt: Date } {
  if (coupon.validityType === 'FIXED') return { validFrom: coupon.validityStartAt as Date, expiresAt: coupon.validityEndAt as Date };
  return { validFrom: now, expiresAt: new Date(now.getTime() + (coupon.validityDays as number) * DAY_MS) };
}

/**
 * Issuing a user coupon, whatever the reason: optional stock deduction, the row, and its
 * `null -> UNUSED` log row, all in the caller's transaction.
 */
@Injectable()
export class IssueService {
  constructor(private readonly stock: StockService) {}

  async issue(em: EntityManager, input: IssueInput): Promise<UserCoupon> {
    const now = input.now ?? new Date();
    if (input.fromStock && !(await this.stock.deduct(em, input.coupon.id, 1, now))) {
      throw soldOutError(input.coupon.id);
    }
    const { validFrom, expiresAt } = validityWindow(input.coupon, now);
    const res = (await em.query(
      `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, idempotency_key, replaces_user_coupon_id, reason, issued_at, valid_from, expires_at, used_at, updated_at)
       VALUES (?, ?, 'UNUSED', ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)`,
      [input.coupon.id, input.userId, input.source, input.fromStock, input.idempotencyKey ?? null, input.replacesUserCouponId ?? null, input.reason ?? null, now, validFrom, expiresAt, now],
    )) as { insertId: number | string };
    const id = String(res.insertId);
    await writeLog(em, [{ userCouponId: id, from: null, to: 'UNUSED', txId: input.txId, reason: input.reason ?? input.source, at: now }]);
    return Object.assign(new UserCoupon(), {
      id,
      couponId: input.coupon.id,
      userId: input.userId,
      status: 'UNUSED' as const,
      source: input.source,
      fromStock: input.fromStock,
      idempotencyKey: input.idempotencyKey ?? null,
      replacesUserCouponId: input.replacesUserCouponId ?? null,
      reason: input.reason ?? null,
      issuedAt: now,
      validFrom,
      expiresAt,
      usedAt: null,
      updatedAt: now,
    });
  }
}
