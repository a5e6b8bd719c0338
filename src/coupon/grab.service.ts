import { Injectable } from '@nestjs/common';
import DataLoader from 'dataloader';
import { DataSource } from 'typeorm';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { counter, histogram } from '../common/metrics.js';
import { withLookup } from '../database/outcome.js';
import { TransactionService } from '../database/transaction.service.js';
import { RateLimitService } from '../rate-limit/rate-limit.service.js';
import { Coupon, grabClosesAt } from './coupon.entity.js';
import { AppConfig } from '../config/app-config.js';
import { CouponService } from './coupon.service.js';
import { GrabDecision, GrabRequest, grabEnded, GroupKeyCollision, identity, keyReused, refused } from './grab-decision.js';
import { GrabGroupService } from './grab-group.service.js';
import { GrabSeries } from './grab-series.js';
import { IssueService, soldOutError } from '../ledger/issue.service.js';
import { toIssuedView, UserCoupon, type UserCouponView } from '../ledger/user-coupon.entity.js';
import { findByKeys } from '../ledger/user-coupons.js';

const outcomes = counter('grab_outcomes_total', 'Grab answers by coupon (unknown for ids that name none) and result code', [
  'coupon_id',
  'result',
]);
const latency = histogram(
  'grab_duration_seconds',
  'Grab latency by result code',
  ['result'],
  [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
);

/** Refusals of a grab that its duplicate (same user, key and coupon) would meet as well, a moment later. */
const FINAL_REFUSALS = new Set(['SOLD_OUT', 'COUPON_PAUSED', 'GRAB_NOT_STARTED', 'GRAB_ENDED', 'USER_LIMIT_REACHED']);

export interface GrabResult {
  userCoupon: UserCoupon;
  replayed: boolean;
}

/** A grab's answer (201): the coupon as issued, with Idempotent-Replayed on a replay. The controller and both ways ahead of it send this. */
export function issuedAnswer({ userCoupon, replayed }: GrabResult): { headers: Record<string, string>; body: UserCouponView } {
  return { headers: replayed ? { 'idempotent-replayed': 'true' } : {}, body: toIssuedView(userCoupon) };
}

/**
 * The grab flow: eligibility and the sold-out hint (memory), limiter, then one transaction that deducts stock,
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
      const found = await findByKeys(this.dataSource.manager, requests);
      const byIdentity = new Map(found.map((uc) => [identity({ userId: uc.userId, key: uc.idempotencyKey as string }), uc]));
      return requests.map((r) => byIdentity.get(identity(r)) ?? null);
    },
    // setImmediate: every request parsed in one pass of the event loop joins the same batch.
    { cache: false, maxBatchSize: 500, cacheKeyFn: identity, batchScheduleFn: (run) => setImmediate(run) },
  );

  /** Grabs being decided here, by identity (user and key): a duplicate waits for the first (deduplicated). */
  private readonly inFlight = new Map<string, { couponId: string; result: Promise<GrabResult> }>();

  constructor(
    private readonly dataSource: DataSource,
    private readonly coupons: CouponService,
    private readonly issuer: IssueService,
    private readonly tx: TransactionService,
    private readonly rateLimit: RateLimitService,
    private readonly groups: GrabGroupService,
    private readonly config: AppConfig,
    private readonly series: GrabSeries,
  ) {}

  async grab(userId: string, couponId: string, key: string): Promise<GrabResult> {
    const started = process.hrtime.bigint();
    let result = 'ERROR';
    try {
      const r = await this.deduplicated(userId, couponId, key);
      result = r.replayed ? 'REPLAYED' : 'ISSUED';
      return r;
    } catch (err) {
      if (err instanceof AppError) result = err.code;
      throw withLookup(err, { idempotencyKey: key, lookup: `GET /grabs/${key}` });
    } finally {
      // Unknown ids are not tracked: a scan of made-up ids would push real campaigns out of the series
      // (and would add a metric series per id).
      const known = result !== 'COUPON_NOT_FOUND';
      outcomes.inc({ coupon_id: known ? couponId : 'unknown', result });
      if (known) this.series.record(couponId, result);
      latency.observe({ result }, Number(process.hrtime.bigint() - started) / 1e9);
    }
  }

  /**
   * A duplicate (same user and key) of a grab still being decided on this instance waits for it and
   * is answered as its replay (or 422 for another coupon), as API.md asks; on its own it would meet
   * the per-user limiter, spent by the first, before a key not yet committed could be found, and get
   * 429. If the first did not issue a coupon, the duplicate is decided on its own, one at a time.
   */
  private async deduplicated(userId: string, couponId: string, key: string): Promise<GrabResult> {
    const id = identity({ userId, key });
    let first = this.inFlight.get(id);
    // An id that names no coupon is 404 as ever, not a 422 (nor a metric label) made up of it.
    if (first && !this.coupons.heldTemplate(couponId)) await this.coupons.template(couponId);
    for (; first; first = this.inFlight.get(id)) {
      const settled = await first.result.then(
        (won) => ({ won }),
        (err: unknown) => ({ err }),
      );
      if ('won' in settled) return this.replay(settled.won.userCoupon, couponId);
      // Refused for what the duplicate would meet too: the same answer, not a 429 from the limiter the first spent.
      if (settled.err instanceof AppError && FINAL_REFUSALS.has(settled.err.code) && first.couponId === couponId) throw settled.err;
    }
    const result = this.attempt(userId, couponId, key);
    this.inFlight.set(id, { couponId, result });
    try {
      return await result;
    } finally {
      this.inFlight.delete(id);
    }
  }

  /**
   * The happy path costs no read before the transaction: the transaction itself finds a key that
   * was used before (a duplicate key, or the group's lookup under the stock lock). A grab refused
   * without that lookup (rate limited, paused, outside the window, sold out) looks its key up, since
   * a replay of a grab that succeeded earlier must still answer that coupon. The lookups of a flood
   * are batched (one query per tick), so the limiter still keeps it from the grab transactions.
   */
  private async attempt(userId: string, couponId: string, key: string): Promise<GrabResult> {
    // A held template without a promise (the common case); template() is async even then.
    const coupon = this.coupons.heldTemplate(couponId) ?? (await this.coupons.template(couponId));
    // Before the limiter: what memory already knows is final spends no token (nor a call to Redis),
    // and a shopper limited as the last coupons go is told SOLD_OUT at the next try, not 429 until admitted.
    const refusal = this.precheck(coupon, new Date());
    if (refusal) return this.settle(refused(refusal, false), userId, key, couponId);
    try {
      await this.rateLimit.admitGrab(couponId, userId, coupon.rateLimitPerSecond);
    } catch (err) {
      // A client retrying a grab it won is answered its coupon, not 429 (API.md: a replay answers the same).
      if (err instanceof AppError && err.code === 'RATE_LIMITED') return this.settle(refused(err, false), userId, key, couponId);
      throw err;
    }
    try {
      return await this.settle(await this.decide(coupon, userId, key), userId, key, couponId);
    } catch (err) {
      if (err instanceof AppError && err.code === 'SOLD_OUT') this.coupons.markSoldOut(couponId);
      throw err;
    }
  }

  /** The one place a decision becomes an answer; a refusal made without the key in view looks it up first. */
  private async settle(d: GrabDecision, userId: string, key: string, couponId: string): Promise<GrabResult> {
    if (d.outcome !== 'refused') return { userCoupon: d.userCoupon, replayed: d.outcome === 'replayed' };
    if (d.keyChecked) throw d.error;
    const earlier = await this.byKey(userId, key);
    if (earlier) return this.replay(earlier, couponId);
    throw d.error;
  }

  private async decide(coupon: Coupon, userId: string, key: string): Promise<GrabDecision> {
    if (this.config.GRAB_STRATEGY === 'per-request') return this.perRequest(coupon, userId, key);
    try {
      return await this.groups.submit(coupon, { userId, key });
    } catch (err) {
      if (!(err instanceof GroupKeyCollision)) throw err;
    }
    // The group collided twice with keys committed meanwhile for other coupons: decide this one alone.
    return this.perRequest(coupon, userId, key);
  }

  /**
   * One transaction for this grab alone (IssueService.grab). Its refusals are made without looking at keys; a duplicate key means a grab
   * with this key committed (a replay) or is still in flight.
   */
  private async perRequest(coupon: Coupon, userId: string, key: string): Promise<GrabDecision> {
    try {
      const userCoupon = await this.tx.inTransaction(async (em) => {
        const uc = await this.issuer.grab(em, coupon, userId, key);
        // Checked again once the stock row's lock is held (a grab may queue for it): one admitted a moment
        // before the end must not commit a coupon born EXPIRED.
        const now = new Date();
        if (now >= grabClosesAt(coupon)) throw grabEnded(coupon, now);
        return uc;
      });
      this.coupons.stockChanged(coupon.id);
      return { outcome: 'granted', userCoupon };
    } catch (err) {
      if (isDuplicateKey(err)) {
        return refused(
          new AppError('IDEMPOTENCY_IN_PROGRESS', 'A grab with this key is still in progress; retry', { idempotencyKey: key }),
          false,
        );
      }
      if (err instanceof AppError && ['SOLD_OUT', 'USER_LIMIT_REACHED', 'GRAB_ENDED'].includes(err.code)) return refused(err, false);
      throw err;
    }
  }

  /** Refusals that need no database: eligibility, and the sold-out hint. */
  private precheck(coupon: Coupon, now: Date): AppError | null {
    if (coupon.status !== 'ACTIVE') return new AppError('COUPON_PAUSED', 'This coupon is paused', { couponId: coupon.id });
    if (now < coupon.grabStartAt)
      return new AppError('GRAB_NOT_STARTED', 'Grabbing has not started', { grabStartAt: coupon.grabStartAt.toISOString() });
    if (now >= grabClosesAt(coupon)) return grabEnded(coupon, now);
    if (this.coupons.isSoldOut(coupon.id)) return soldOutError(coupon.id);
    return null;
  }

  private replay(uc: UserCoupon, couponId: string): GrabResult {
    if (uc.couponId !== couponId) throw keyReused(uc.couponId);
    return { userCoupon: uc, replayed: true };
  }

  byKey(userId: string, key: string): Promise<UserCoupon | null> {
    return this.keys.load({ userId, key });
  }
}
