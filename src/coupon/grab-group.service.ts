import { Injectable } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { AppConfig } from '../config/app-config.js';
import { isDeadlineTimeout, isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { histogram } from '../common/metrics.js';
import { currentDeadline, Deadline, hasTimeLeft, runWithDeadline } from '../database/deadline-pool.js';
import { TransactionService } from '../database/transaction.service.js';
import { Coupon, grabClosesAt } from './coupon.entity.js';
import { CouponService } from './coupon.service.js';
import { GrabDecision, GrabRequest, grabEnded, GroupKeyCollision, identity, keyReused, refused } from './grab-decision.js';
import { IssueService, soldOutError, userLimitReached } from '../ledger/issue.service.js';
import { StockRow, StockService } from '../ledger/stock.service.js';
import { UserCoupon } from '../ledger/user-coupon.entity.js';
import { countTowardsLimit, findByKeys } from '../ledger/user-coupons.js';

const groupSizes = histogram('grab_group_size', 'Grabs decided by one grouped transaction', [], [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000]);

interface Waiter extends GrabRequest {
  resolve(d: GrabDecision): void;
  reject(err: unknown): void;
  /** The deadline of the request this grab answers (none when called outside a request). */
  deadline?: Deadline;
}

const deadlinePassed = () =>
  new AppError('SERVICE_UNAVAILABLE', 'The grab waited for its group past the request deadline; retry with the same key', undefined, {
    'Retry-After': '1',
  });

/** What a grab needs left of its deadline to go into the next group after its own was cut short by another's (drain). */
const REQUEUE_MIN_MS = 1000;

interface Queue {
  waiting: Waiter[];
  running: boolean;
}

/**
 * Group deduction for a hot coupon. Grabs of one coupon that arrive while a group's transaction is
 * running wait for it and then form the next group: one transaction locks the stock row, decides
 * every waiting request against the remaining stock, per-user limits and keys already used,
 * inserts the winners in one statement, deducts the exact count and commits. Only after the commit
 * is anyone answered, so a failed group has told no one "success". A lone request waits only for
 * the end of the current event-loop turn.
 */
@Injectable()
export class GrabGroupService {
  private readonly queues = new Map<string, Queue>();

  constructor(
    private readonly tx: TransactionService,
    private readonly issuer: IssueService,
    private readonly stock: StockService,
    private readonly config: AppConfig,
    private readonly coupons: CouponService,
  ) {}

  submit(coupon: Coupon, request: GrabRequest): Promise<GrabDecision> {
    return new Promise((resolve, reject) => {
      let queue = this.queues.get(coupon.id);
      if (!queue) this.queues.set(coupon.id, (queue = { waiting: [], running: false }));
      // Named fields, not a spread: V8 copies a spread object on a slow path, several microseconds a grab.
      queue.waiting.push({ userId: request.userId, key: request.key, resolve, reject, deadline: currentDeadline() });
      if (!queue.running) void this.drain(coupon, queue);
    });
  }

  private async drain(coupon: Coupon, queue: Queue): Promise<void> {
    queue.running = true;
    // At least to the end of this event-loop turn: a burst parsed in one turn (the first second of a
    // sale) forms one group instead of a lone first request that the rest must wait behind.
    await new Promise((r) => (this.config.GRAB_GROUP_WAIT_MS > 0 ? setTimeout(r, this.config.GRAB_GROUP_WAIT_MS) : setImmediate(r)));
    while (queue.waiting.length > 0) {
      const taken = queue.waiting.splice(0, this.config.GRAB_GROUP_MAX);
      // A grab whose request ran out of time while it queued was answered 503 already: it must not
      // be issued now, and its deadline must not cut the others' group short.
      const group: Waiter[] = [];
      for (const w of taken) {
        if (!w.deadline || hasTimeLeft(w.deadline)) group.push(w);
        else w.reject(deadlinePassed());
      }
      if (group.length === 0) continue;
      groupSizes.observe(group.length);
      try {
        const decisions = await this.underEarliestDeadline(group, () => this.decideGroup(coupon, group));
        group.forEach((w, i) => w.resolve(decisions[i]));
      } catch (err) {
        // Cut short by the deadline of its earliest request: those with a second or more left go into
        // the next group, not answered 503 seconds before their own deadline (a coupon that did commit
        // unseen is found by its key there). Not those with less: each group cut short leaves its
        // statement waiting on the stock row's lock in the server until the lock-wait timeout, and one
        // retry per distinct deadline of a burst filled the server's connections during a stall.
        const cutShort = isDeadlineTimeout(err) && group.some((w) => w.deadline && !hasTimeLeft(w.deadline));
        const again = cutShort ? group.filter((w) => !w.deadline || hasTimeLeft(w.deadline, REQUEUE_MIN_MS)) : [];
        for (const w of group) if (!again.includes(w)) w.reject(err);
        queue.waiting.unshift(...again);
      }
    }
    queue.running = false;
    this.queues.delete(coupon.id);
  }

  /**
   * The group's statements end by the earliest deadline of its requests, so none of them can be
   * answered 503 (its deadline) while the group goes on to commit its coupon. Without this a group
   * would run in the context of whichever request started the queue, with job limits once that one
   * had been answered.
   */
  private underEarliestDeadline<T>(group: readonly Waiter[], fn: () => Promise<T>): Promise<T> {
    const at = Math.min(...group.map((w) => (w.deadline && !w.deadline.answered ? w.deadline.at : Infinity)));
    return Number.isFinite(at) ? runWithDeadline({ at, answered: false }, fn) : fn();
  }

  /**
   * A duplicate key means a grab of another coupon committed one of the group's (user, key) pairs
   * after the group had read the keys. The group runs once more, and that read now sees it (the
   * request is answered IDEMPOTENCY_KEY_REUSED); only a second collision fails the whole group
   * (GroupKeyCollision), whose requests are then decided one by one.
   */
  private async decideGroup(coupon: Coupon, group: GrabRequest[]): Promise<GrabDecision[]> {
    // The stock the committed group left is exact (it held the row's lock), so the coupon page shows it before anyone is answered.
    const run = async () => {
      const { decisions, left } = await this.tx.inTransaction((em) => this.decide(em, coupon, group));
      if (left) this.coupons.stockAfterGrabs(coupon.id, left);
      return decisions;
    };
    try {
      return await run();
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
    }
    try {
      return await run();
    } catch (err) {
      throw isDuplicateKey(err) ? new GroupKeyCollision(err) : err;
    }
  }

  /** Runs inside the group's transaction; pure with respect to everything but `em`, so a retry recomputes it all. */
  private async decide(
    em: EntityManager,
    coupon: Coupon,
    group: GrabRequest[],
  ): Promise<{ decisions: GrabDecision[]; left: StockRow | null }> {
    const locked = await this.stock.lock(em, coupon.id);
    // After the lock (a group may queue behind others): one admitted a moment before the end must not commit coupons born EXPIRED.
    const now = new Date();
    const ended = now >= grabClosesAt(coupon);
    let remaining = locked?.stock ?? 0;
    const earlier = await findByKeys(em, group);
    const byIdentity = new Map(earlier.map((uc) => [identity({ userId: uc.userId, key: uc.idempotencyKey as string }), uc]));
    const users = [...new Set(group.map((r) => r.userId))];
    const held = await countTowardsLimit(em, coupon.id, users);

    // First pass: who gets a coupon. Requests repeating a key (earlier, or earlier in this group) replay it.
    const plan: (GrabDecision | 'GRANT' | 'REPLAY')[] = [];
    const granted: GrabRequest[] = [];
    const seen = new Set<string>();
    for (const r of group) {
      const id = identity(r);
      const prior = byIdentity.get(id);
      if (prior) {
        plan.push(prior.couponId === coupon.id ? 'REPLAY' : refused(keyReused(prior.couponId), true));
      } else if (seen.has(id)) {
        plan.push('REPLAY');
      } else if (ended) {
        plan.push(refused(grabEnded(coupon, now), true));
      } else if (remaining === 0) {
        // Stock before the limit, as a single grab and the memory path decide: a shopper holding the
        // last coupon who clicks again is told SOLD_OUT however the click was grouped.
        plan.push(refused(soldOutError(coupon.id), true));
      } else if ((held.get(r.userId) ?? 0) >= coupon.perUserLimit) {
        plan.push(refused(userLimitReached(coupon.perUserLimit), true));
      } else {
        plan.push('GRANT');
        granted.push(r);
        seen.add(id);
        remaining--;
        held.set(r.userId, (held.get(r.userId) ?? 0) + 1);
      }
    }
    for (const uc of await this.issuer.issueGrabs(em, coupon, granted, now))
      byIdentity.set(identity({ userId: uc.userId, key: uc.idempotencyKey as string }), uc);

    const firstAnswer = new Set<string>();
    const decisions = group.map((r, i): GrabDecision => {
      const step = plan[i];
      if (typeof step !== 'string') return step;
      const id = identity(r);
      const replayed = step === 'REPLAY' || firstAnswer.has(id);
      firstAnswer.add(id);
      return { outcome: replayed ? 'replayed' : 'granted', userCoupon: byIdentity.get(id) as UserCoupon };
    });
    return { decisions, left: locked && { initStock: locked.initStock, stock: remaining } };
  }
}
