import { Injectable } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { AppError } from '../common/errors.js';
import { writeLog } from './state-log.js';
import { isLegal, UserCouponStatus } from './transitions.js';
import { setStatus } from './user-coupons.js';

@Injectable()
export class StateMachineService {
  /**
   * Moves one user coupon from `from` to `to`: refused if the table forbids it, a compare-and-set on
   * the current status (0 rows: someone else moved it first, STATUS_CONFLICT), and a log row in
   * the same transaction.
   */
  async transit(
    em: EntityManager,
    userCouponId: string,
    from: UserCouponStatus,
    to: UserCouponStatus,
    txId: string,
    reason?: string | null,
    at = new Date(),
  ): Promise<void> {
    await this.transitAll(em, [userCouponId], from, to, txId, reason, at);
  }

  /**
   * The same move for several coupons (the expiry sweep's batch, rows the caller has locked): all
   * of them or, if any is no longer `from`, none (STATUS_CONFLICT rolls the caller back).
   */
  async transitAll(
    em: EntityManager,
    ids: readonly string[],
    from: UserCouponStatus,
    to: UserCouponStatus,
    txId: string,
    reason?: string | null,
    at = new Date(),
  ): Promise<void> {
    const details = ids.length === 1 ? { userCouponId: ids[0], from, to } : { from, to };
    if (!isLegal(from, to)) throw new AppError('ILLEGAL_TRANSITION', `A coupon cannot move from ${from} to ${to}`, details);
    if (ids.length === 0) return;
    const changed = await setStatus(em, ids, from, to, at);
    if (changed !== ids.length) {
      const what = ids.length === 1 ? `User coupon ${ids[0]} is` : `${ids.length - changed} of ${ids.length} user coupons are`;
      throw new AppError('STATUS_CONFLICT', `${what} no longer ${from}`, details);
    }
    await writeLog(
      em,
      ids.map((userCouponId) => ({ userCouponId, from, to, txId, reason, at })),
    );
  }
}
