import { Injectable } from '@nestjs/common';
import DataLoader from 'dataloader';
import { InjectRepository } from '@nestjs/typeorm';
import { Repository } from 'typeorm';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { counter, histogram } from '../common/metrics.js';
import { TransactionService } from '../database/transaction.service.js';
import { RateLimitService } from '../rate-limit/rate-limit.service.js';
import { Coupon } from './coupon.entity.js';
import { AppConfig } from '../config/app-config.js';
import { CouponService } from './coupon.service.js';
import { GrabGroupService, GrabRequest, identity, keyReused } from './grab-group.service.js';
import { IssueService, soldOutError } from './issue.service.js';
import { UserCoupon } from './user-coupon.entity.js';

const outcomes = counter('grab_outcomes_total', 'Grab answers by result code', ['result']);
const latency = histogram('grab_duration_seconds', 'Grab latency by result code', ['result'], [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]);

/** Refusals that a replay of an earlier, successful grab with the same key must not get. */
const REPLAYABLE = new Set(['COUPON_PAUSED', 'GRAB_NOT_STARTED', 'GRAB_ENDED', 'SOLD_OUT', 'USER_LIMIT_REACHED']);

export interface GrabResult {
  userCoupon: UserCoupon;
  replayed: boolean;
}

/**
 * The grab flow: limiter, idempotency, eligibility, then one transaction that deducts stock,
 * issues the coupon with its log row and checks the per-user limit while holding the stock row's
 * lock, so the limit cannot be raced.
 */
@Injectable()
export class GrabService {
  /**
   * Key lookups of refused grabs (after a sell-out, thousands a second) are gathered per tick into
   * one query, so the flood after the last coupon costs the database a few reads, not one each.
   */
  private readonly keys = new DataLoader<GrabRequest, UserCoupon | null, string>(
    async (requests) => {
      const found = await this.userCoupons.find({ where: requests.map((r) => ({ userId: r.userId, idempotencyKey: r.key })) });
      const byIdentity = new Map(found.map((uc) => [identity({ userId: uc.userId, key: uc.idempotencyKey as string }), uc]));
      return requests.map((r) => byIdentity.get(identity(r)) ?? null);
    },
    { cache: false, maxBatchSize: 500, cacheKeyFn: identity },
  );

  constructor(
    @InjectRepository(UserCoupon) private readonly userCoupons: Repository<UserCoupon>,
    private readonly coupons: CouponService,
    private readonly issuer: IssueService,
    private readonly tx: TransactionService,
    private readonly rateLimit: RateLimitService,
    private readonly groups: GrabGroupService,
    private readonly config: AppConfig,
  ) {}

  async grab(userId: string, couponId: string, key: string): Promise<GrabResult> {
    const started = process.hrtime.bigint();
    let result = 'ERROR';
    try {
      const r = await this.attempt(userId, couponId, key);
      result = r.replayed ? 'REPLAYED' : 'ISSUED';
      return r;
    } catch (err) {
      if (err instanceof AppError) result = err.code;
      throw err;
    } finally {
      outcomes.inc({ result });
      latency.observe({ result }, Number(process.hrtime.bigint() - started) / 1e9);
    }
  }

  /**
   * The happy path costs no read before the transaction: the transaction itself finds a key that
   * was used before (a duplicate key, or the group's lookup under the stock lock). A grab refused
   * before it (paused, outside the window, sold out) looks its key up, since a replay of a grab that
   * succeeded earlier must still answer that coupon.
   */
  private async attempt(userId: string, couponId: string, key: string): Promise<GrabResult> {
    const coupon = await this.coupons.template(couponId);
    await this.rateLimit.admitGrab(couponId, userId, coupon.rateLimitPerSecond);
    try {
      this.checkEligible(coupon, new Date());
      if (this.coupons.isSoldOut(couponId)) throw soldOutError(couponId);
      return await this.decide(coupon, userId, key);
    } catch (err) {
      if (err instanceof AppError && err.code === 'SOLD_OUT') this.coupons.markSoldOut(couponId);
      if (isDuplicateKey(err) || (err instanceof AppError && REPLAYABLE.has(err.code))) {
        const earlier = await this.byKey(userId, key);
        if (earlier) return this.replay(earlier, couponId);
        if (isDuplicateKey(err)) throw new AppError('IDEMPOTENCY_IN_PROGRESS', 'A grab with this key is still in progress; retry', { idempotencyKey: key });
      }
      throw err;
    }
  }

  private async decide(coupon: Coupon, userId: string, key: string): Promise<GrabResult> {
    if (this.config.GRAB_STRATEGY === 'per-request') return this.perRequest(coupon, userId, key);
    try {
      const decision = await this.groups.submit(coupon, { userId, key });
      if (decision instanceof AppError) throw decision;
      return decision;
    } catch (err) {
      // A group fails as a whole on a key inserted meanwhile for another coupon; decide this one alone.
      if (isDuplicateKey(err)) return this.perRequest(coupon, userId, key);
      throw err;
    }
  }

  /** One transaction for this grab alone: deduct, issue, then check the per-user limit under the stock row lock. */
  private async perRequest(coupon: Coupon, userId: string, key: string): Promise<GrabResult> {
    const userCoupon = await this.tx.inTransaction(async (em) => {
      const uc = await this.issuer.issue(em, { coupon, userId, source: 'GRAB', fromStock: true, idempotencyKey: key, txId: `grab:${key}` });
      // Counted after our own insert, still under the stock row lock every grab of this coupon takes.
      const [{ n }] = (await em.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND user_id = ? AND source = 'GRAB'`, [coupon.id, userId])) as { n: string }[];
      if (Number(n) > coupon.perUserLimit) {
        throw new AppError('USER_LIMIT_REACHED', `At most ${coupon.perUserLimit} of this coupon per user`, { perUserLimit: coupon.perUserLimit });
      }
      return uc;
    });
    return { userCoupon, replayed: false };
  }

  private checkEligible(coupon: Coupon, now: Date): void {
    if (coupon.status !== 'ACTIVE') throw new AppError('COUPON_PAUSED', 'This coupon is paused', { couponId: coupon.id });
    if (now < coupon.grabStartAt) throw new AppError('GRAB_NOT_STARTED', 'Grabbing has not started', { grabStartAt: coupon.grabStartAt.toISOString() });
    if (now >= coupon.grabEndAt) throw new AppError('GRAB_ENDED', 'Grabbing has ended', { grabEndAt: coupon.grabEndAt.toISOString() });
  }

  private replay(uc: UserCoupon, couponId: string): GrabResult {
    if (uc.couponId !== couponId) throw keyReused(uc.couponId);
    return { userCoupon: uc, replayed: true };
  }

  byKey(userId: string, key: string): Promise<UserCoupon | null> {
    return this.keys.load({ userId, key });
  }
}
