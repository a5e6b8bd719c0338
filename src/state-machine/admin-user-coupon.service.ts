import { Injectable } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { Coupon } from '../coupon/coupon.entity.js';
import { IssueService, validityEnded } from '../ledger/issue.service.js';
import { effectiveStatus, toIssuedView, toUserCouponView, UserCoupon, UserCouponView } from '../ledger/user-coupon.entity.js';
import { findByKeys, findReplacement, lockUserCoupon } from '../ledger/user-coupons.js';
import { TransactionService } from '../database/transaction.service.js';
import { releaseTimedOutHold } from '../redemption/holds.js';
import { ReissueUserCouponDto } from './admin-user-coupon.dto.js';
import { findLog } from '../ledger/state-log.js';
import { TxIds } from '../ledger/tx-id.js';
import { StateMachineService } from '../ledger/state-machine.service.js';
import { replay, UserCouponStatus } from '../ledger/transitions.js';

export interface UserCouponHistory {
  userCoupon: UserCouponView;
  transitions: { from: UserCouponStatus | null; to: UserCouponStatus; txId: string; reason: string | null; at: string }[];
  replayedStatus: UserCouponStatus | null;
  /** The index in `transitions` of the first step that is no move of the lifecycle or does not start where the one before ended; null when every step is. */
  firstInconsistentStep: number | null;
  consistent: boolean;
}

/**
 * An operator's Idempotency-Key is stored on the reissued coupon with this prefix: clients' grab keys
 * cannot contain ':', so the two never meet in the (user, key) unique index.
 */
const REISSUE_KEY_PREFIX = 'reissue:';
/** The column holds 128 characters, prefix included. */
export const REISSUE_KEY_MAX = 128 - REISSUE_KEY_PREFIX.length;

export interface ReissueResult {
  userCoupon: UserCouponView;
  replayed: boolean;
}

/** The reissue an earlier request with this key made, if it asked for the same thing. */
function replayReissue(earlier: UserCoupon, dto: ReissueUserCouponDto): ReissueResult {
  if (
    earlier.couponId !== dto.couponId ||
    earlier.fromStock !== dto.fromStock ||
    earlier.reason !== dto.reason ||
    earlier.replacesUserCouponId !== (dto.replacesUserCouponId ?? null)
  ) {
    throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This Idempotency-Key was already used for a different reissue to this user', {
      userCouponId: earlier.id,
    });
  }
  return { userCoupon: toIssuedView(earlier), replayed: true };
}

function notFound(userCouponId: string): AppError {
  return new AppError('USER_COUPON_NOT_FOUND', `User coupon ${userCouponId} does not exist`, { userCouponId });
}

/** Operators' actions on single user coupons: void, reissue, and the lifecycle replay. */
@Injectable()
export class AdminUserCouponService {
  constructor(
    private readonly tx: TransactionService,
    private readonly stateMachine: StateMachineService,
    private readonly issuer: IssueService,
  ) {}

  /**
   * UNUSED or EXPIRED -> VOID. The row is locked first, so a concurrent redemption or void either
   * finished before (and this answers ILLEGAL_TRANSITION) or waits for this one. An UNUSED coupon
   * past its expiry is EXPIRED to everyone, and a LOCKED one past its hold's time is released, so
   * the log records that step before the void and the replay stays legal. A coupon held for an
   * order (LOCKED) is refused: the order may still be paid.
   */
  voidUserCoupon(userCouponId: string, reason: string, adminId: string): Promise<UserCouponView> {
    return this.tx.inTransaction(async (em) => {
      const txId = TxIds.admin(adminId, 'void');
      const uc = await this.lock(em, userCouponId, 'exclusive');
      // After the wait for the coupon: a hold that timed out meanwhile no longer refuses the void.
      const now = new Date();
      const status = effectiveStatus(uc, now);
      if (status === 'LOCKED') {
        throw new AppError('COUPON_LOCKED', 'This coupon is held for an unpaid order; it can be voided once released', {
          lockedUntil: uc.lockedUntil?.toISOString(),
        });
      }
      if (uc.status === 'LOCKED') await releaseTimedOutHold(em, this.stateMachine, uc, now);
      else if (status !== uc.status) await this.stateMachine.transit(em, uc.id, uc.status, status, txId, 'expired', now);
      await this.stateMachine.transit(em, uc.id, status, 'VOID', txId, reason, now);
      return toUserCouponView(Object.assign(uc, { status: 'VOID', updatedAt: now }), now);
    });
  }

  /**
   * A new REISSUE coupon for the user, taking stock or not, linked to the one it replaces. With an
   * Idempotency-Key, a retry (a double click, a timed-out request sent again) answers the coupon
   * the first request issued instead of issuing another: the key is unique per user in the database,
   * so of two concurrent requests one inserts and the other replays it.
   */
  async reissue(dto: ReissueUserCouponDto, adminId: string, key?: string): Promise<ReissueResult> {
    const stored = key === undefined ? null : REISSUE_KEY_PREFIX + key;
    const earlier = (em: EntityManager) => (stored === null ? Promise.resolve([]) : findByKeys(em, [{ userId: dto.userId, key: stored }]));
    try {
      return await this.tx.inTransaction(async (em) => {
        const [replay] = await earlier(em);
        if (replay) return replayReissue(replay, dto);
        const coupon = await em.findOneBy(Coupon, { id: dto.couponId });
        if (!coupon) throw new AppError('COUPON_NOT_FOUND', `Coupon ${dto.couponId} does not exist`, { couponId: dto.couponId });
        if (dto.replacesUserCouponId !== undefined) {
          // Locked, so that of two replacements of one coupon (two operators on one ticket) the second
          // waits and finds the first: a coupon is made good once.
          const replaced = await lockUserCoupon(em, dto.replacesUserCouponId, 'exclusive');
          // Another user's coupon is "not found" for this user, as on GET /me/coupons/:id; an operator is told why.
          if (replaced && replaced.userId !== dto.userId)
            throw new AppError('USER_COUPON_NOT_FOUND', `User coupon ${replaced.id} belongs to another user, not to ${dto.userId}`, {
              userCouponId: replaced.id,
            });
          if (!replaced) throw notFound(dto.replacesUserCouponId);
          const replacement = await findReplacement(em, replaced.id);
          if (replacement)
            throw new AppError('ALREADY_REPLACED', `User coupon ${replaced.id} was replaced already, by ${replacement}`, {
              userCouponId: replaced.id,
              replacedBy: replacement,
            });
        }
        // After the wait for the replaced coupon: a validity that ended meanwhile would give a coupon born expired.
        const ended = validityEnded(coupon, new Date());
        if (ended) throw ended;
        const uc = await this.issuer.issue(em, {
          coupon,
          userId: dto.userId,
          source: 'REISSUE',
          fromStock: dto.fromStock,
          idempotencyKey: stored,
          replacesUserCouponId: dto.replacesUserCouponId ?? null,
          reason: dto.reason,
          txId: TxIds.admin(adminId, 'reissue'),
        });
        return { userCoupon: toIssuedView(uc), replayed: false };
      });
    } catch (err) {
      // A concurrent request with the same key committed first; this one rolled back: answer that one.
      if (stored === null || !isDuplicateKey(err)) throw err;
      const [replay] = await this.tx.inTransaction(earlier);
      if (!replay) throw err;
      return replayReissue(replay, dto);
    }
  }

  /**
   * The coupon and its log, read under a shared lock on the coupon row so no transition can commit
   * between the two reads (which would report a false inconsistency).
   */
  history(userCouponId: string): Promise<UserCouponHistory> {
    return this.tx.inTransaction(async (em) => {
      const uc = await this.lock(em, userCouponId, 'shared');
      const log = await findLog(em, userCouponId);
      const replayed = replay(log.map((l) => ({ from: l.fromStatus, to: l.toStatus })));
      return {
        userCoupon: toUserCouponView(uc),
        transitions: log.map((l) => ({
          from: l.fromStatus,
          to: l.toStatus,
          txId: l.txId,
          reason: l.reason,
          at: l.createdAt.toISOString(),
        })),
        replayedStatus: replayed.status,
        firstInconsistentStep: replayed.legal ? null : replayed.lastConsistentIndex + 1,
        consistent: replayed.legal && replayed.status === uc.status,
      };
    });
  }

  private async lock(em: EntityManager, userCouponId: string, mode: 'shared' | 'exclusive'): Promise<UserCoupon> {
    const uc = await lockUserCoupon(em, userCouponId, mode);
    if (!uc) throw notFound(userCouponId);
    return uc;
  }
}
