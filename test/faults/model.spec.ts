import fc from 'fast-check';
import { couponBody, CouponInput } from '../support/factories.js';
import { adminToken, serviceToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, Reply, sleep } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

const CLIENTS = 8;
const RUNS = 6;
const HOUR = 3600_000;

type Status = 'UNUSED' | 'LOCKED' | 'USED' | 'EXPIRED' | 'VOID';
/** A hold's time: long ones never time out during the test, short ones (2 s) do while the clients run. */
const LONG_TTL = 600;
const SHORT_TTL = 2;
/** Around a short hold's expiresAt the outcome depends on which side of it the server decides; the client waits this long past it. */
const EDGE_MS = 1000;

/** The coupon templates the clients play with, each with a behaviour the model must predict. */
/**
 * The coupon templates the clients play with, each with a behaviour the model must predict. `ended`:
 * its fixed validity has passed, so grabbing it has ended too, and reissuing it is refused (no coupon is born EXPIRED).
 */
const TEMPLATES: { name: string; body: CouponInput; scarce: boolean; born: Status; notYetValid: boolean; ended?: boolean }[] = [
  {
    name: 'scarce, returned on refund',
    body: { totalStock: 30, perUserLimit: 2, returnOnRefund: true },
    scarce: true,
    born: 'UNUSED',
    notYetValid: false,
  },
  {
    name: 'plenty, not returned',
    body: { totalStock: 100_000, perUserLimit: 8, returnOnRefund: false },
    scarce: false,
    born: 'UNUSED',
    notYetValid: false,
  },
  {
    name: 'validity ended',
    // Created valid, then its validity moved into the past in the database (beforeAll): creation refuses one already ended.
    body: { totalStock: 100_000, perUserLimit: 2, returnOnRefund: true },
    scarce: false,
    born: 'EXPIRED',
    notYetValid: false,
    ended: true,
  },
  {
    name: 'not valid yet',
    body: {
      totalStock: 100_000,
      perUserLimit: 2,
      returnOnRefund: false,
      validity: {
        type: 'FIXED',
        startAt: new Date(Date.now() + 24 * HOUR).toISOString(),
        endAt: new Date(Date.now() + 48 * HOUR).toISOString(),
      },
    },
    scarce: false,
    born: 'UNUSED',
    notYetValid: true,
  },
];
const THRESHOLD = 10_000;
/** The scarce template, the one with stock for everyone, and how many of the latter each client grabs before its program. */
const SCARCE = 0;
const PLENTY = 1;
const ENDED = TEMPLATES.findIndex((t) => t.ended);
const STARTING_COUPONS = 5;

type Command =
  | { t: 'grab'; template: number; reuseKey: number | null }
  | { t: 'reissue'; template: number }
  | { t: 'redeem'; pick: number; cents: number; reuseOrder: number | null }
  | { t: 'hold'; pick: number; cents: number; reuseOrder: number | null; short: boolean; usable: boolean }
  | { t: 'confirm'; pick: number; sameCents: boolean }
  | { t: 'release'; pick: number; neverHeld: boolean }
  | { t: 'refund'; pick: number; reuseRefund: number | null; redeemed: boolean }
  | { t: 'void'; pick: number }
  | { t: 'read'; pick: number }
  | { t: 'pause' }
  | { t: 'reconcile' };

const command: fc.Arbitrary<Command> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      t: fc.constant('grab' as const),
      template: fc.nat(TEMPLATES.length - 1),
      reuseKey: fc.option(fc.nat(), { freq: 4 }),
    }),
  },
  {
    weight: 4,
    arbitrary: fc.record({
      t: fc.constant('redeem' as const),
      pick: fc.nat(),
      cents: fc.constantFrom(THRESHOLD / 2, THRESHOLD * 2),
      reuseOrder: fc.option(fc.nat(), { freq: 3 }),
    }),
  },
  {
    weight: 5,
    arbitrary: fc.record({
      t: fc.constant('hold' as const),
      pick: fc.nat(),
      cents: fc.constantFrom(THRESHOLD / 2, THRESHOLD * 2),
      reuseOrder: fc.option(fc.nat(), { freq: 3 }),
      short: fc.boolean(),
      // Most holds go to a coupon that can be held, on a fresh order, so that many are placed, confirmed, released and time out.
      usable: fc.constantFrom(true, true, false),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({ t: fc.constant('confirm' as const), pick: fc.nat(), sameCents: fc.constantFrom(true, true, true, false) }),
  },
  { weight: 2, arbitrary: fc.record({ t: fc.constant('release' as const), pick: fc.nat(), neverHeld: fc.boolean() }) },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant('refund' as const),
      pick: fc.nat(),
      reuseRefund: fc.option(fc.nat(), { freq: 3 }),
      redeemed: fc.boolean(),
    }),
  },
  { weight: 1, arbitrary: fc.record({ t: fc.constant('void' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ t: fc.constant('read' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.constant({ t: 'reconcile' as const }) },
  // A client that waits a short hold's time, so its short holds time out under its next commands and the sweep's feet.
  { weight: 1, arbitrary: fc.constant({ t: 'pause' as const }) },
);

interface ModelCoupon {
  id: string;
  template: number;
  /** Stored-as-modelled status; LOCKED means held by `heldBy`, which may have timed out (see UserModel.statusOf). */
  status: Status;
  source: 'GRAB' | 'REFUND_RETURN' | 'REISSUE';
  heldBy?: ModelHold;
}

interface ModelHold {
  holdId: string;
  orderNo: string;
  couponId: string;
  cents: number;
  discountCents: number;
  expiresAt: number;
  /** As last decided: ACTIVE may have timed out since (see UserModel.holdStatus). */
  status: 'ACTIVE' | 'CONFIRMED' | 'RELEASED';
  releaseReason: 'CANCELLED' | 'TIMEOUT' | null;
}

/**
 * What one client (one user) must see: its coupons and their statuses, the keys, orders and refund
 * numbers it used and what they gave. The clients run concurrently; only stock is shared between
 * them, so the model is exact per user except whether a scarce coupon is sold out.
 */
class UserModel {
  readonly coupons: ModelCoupon[] = [];
  /** Idempotency keys used, with the coupon each one issued (null: refused, so nothing is stored under it). */
  readonly keys = new Map<string, { template: number; id: string | null }>();
  readonly redemptions = new Map<string, string>();
  /** orderAmountCents of each redemption: a repeat naming another amount is refused. */
  readonly redeemedCents = new Map<string, number>();
  readonly orders: { orderNo: string; couponId: string }[] = [];
  readonly refunds = new Map<string, { couponId: string; orderNo: string; replacementId: string }>();
  readonly refundedRedemptions = new Map<string, string>();
  /** Holds by `${orderNo}/${couponId}`, in the order they were placed. */
  readonly holds = new Map<string, ModelHold>();
  /** Orders that carry (or carried) a coupon: the amount their first hold or redemption named, and whether refunded. */
  readonly orderBook = new Map<string, { cents: number; refunded: boolean }>();
  private seq = 0;

  constructor(readonly user: string) {}

  fresh(prefix: string): string {
    return `${prefix}-${this.user}-${++this.seq}`;
  }
  grabbed(template: number): number {
    return this.coupons.filter((c) => c.template === template && c.source === 'GRAB').length;
  }
  /** An ACTIVE hold past its expiresAt is released to everyone. */
  holdStatus(h: ModelHold, now = Date.now()): { status: ModelHold['status']; releaseReason: ModelHold['releaseReason'] } {
    return h.status === 'ACTIVE' && now >= h.expiresAt ? { status: 'RELEASED', releaseReason: 'TIMEOUT' } : h;
  }
  statusOf(c: ModelCoupon, now = Date.now()): Status {
    return c.status === 'LOCKED' && c.heldBy && this.holdStatus(c.heldBy, now).status === 'RELEASED' ? 'UNUSED' : c.status;
  }
  /** The coupons on an order: its holds still ACTIVE in time and its redemptions. */
  onOrder(orderNo: string, now = Date.now()): string[] {
    const held = [...this.holds.values()].filter((h) => h.orderNo === orderNo && this.holdStatus(h, now).status === 'ACTIVE');
    const used = [...this.redemptions.keys()].filter((k) => k.startsWith(`${orderNo}/`));
    return [...held.map((h) => h.couponId), ...used.map((k) => k.slice(orderNo.length + 1))];
  }
  /** Waits until no short hold of this user is within EDGE_MS of its expiry, so the model knows which side the server is on. */
  async settle(): Promise<void> {
    const now = Date.now();
    const edge = [...this.holds.values()].filter((h) => h.status === 'ACTIVE' && Math.abs(h.expiresAt - now) < EDGE_MS);
    if (edge.length > 0) await sleep(Math.max(...edge.map((h) => h.expiresAt)) + EDGE_MS - now);
  }
  allOrders(): string[] {
    return [...this.orderBook.keys()];
  }
}

/** Every template's discount: couponBody's default, 1000 off from THRESHOLD. */
const DISCOUNT = 1000;
const STATUS_OF: Record<string, number> = {
  THRESHOLD_NOT_MET: 422,
  ORDER_AMOUNT_MISMATCH: 422,
  HOLD_MISMATCH: 422,
  COUPON_ALREADY_USED: 409,
  COUPON_LOCKED: 409,
  COUPON_VOID: 409,
  COUPON_EXPIRED: 409,
  COUPON_NOT_YET_VALID: 409,
  ORDER_REFUNDED: 409,
  ORDER_HAS_COUPON: 409,
  HOLD_EXPIRED: 409,
  HOLD_RELEASED: 409,
};

/** Why a new hold or redemption (no hold of this pair) of `uc` on `orderNo` is refused, in the order the service checks; null: it succeeds. */
function refusalOf(m: UserModel, uc: ModelCoupon, orderNo: string, cents: number): string | null {
  const byStatus: Record<Status, string | null> = {
    USED: 'COUPON_ALREADY_USED',
    LOCKED: 'COUPON_LOCKED',
    VOID: 'COUPON_VOID',
    EXPIRED: 'COUPON_EXPIRED',
    UNUSED: null,
  };
  const order = m.orderBook.get(orderNo);
  return (
    byStatus[m.statusOf(uc)] ??
    (TEMPLATES[uc.template].notYetValid ? 'COUPON_NOT_YET_VALID' : null) ??
    (cents < THRESHOLD ? 'THRESHOLD_NOT_MET' : null) ??
    (order?.refunded ? 'ORDER_REFUNDED' : null) ??
    (m.onOrder(orderNo).some((id) => id !== uc.id) ? 'ORDER_HAS_COUPON' : null)
  );
}

describe('randomized model test: concurrent clients against an in-memory model', () => {
  let fdb: FaultDatabase;
  let server: Server;
  let templateIds: string[];
  const soldOutSeen = new Set<number>();
  const figures = {
    requests: 0,
    faults: 0,
    violations: 0,
    acknowledgedWritesLost: 0,
    commands: 0,
    reconcileRunsDuringLoad: 0,
    discrepanciesDuringLoad: 0,
    holdsPlaced: 0,
    holdsConfirmed: 0,
    holdsCancelled: 0,
    holdsSeenTimedOut: 0,
    holdsTimedOut: 0,
    holdsReleasedBySweep: 0,
  };

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
    // The expiry sweep runs every 2 s under the clients' feet, as it would in production.
    // The hold sweep runs every second: timed-out holds must look the same before and after it.
    server = await startServer({
      dbName: fdb.name,
      env: { SCHEDULER_ENABLED: 'true', EXPIRE_CRON: '*/2 * * * * *', HOLD_SWEEP_SECONDS: '1' },
    });
    templateIds = [];
    for (const t of TEMPLATES) {
      const validity = {
        type: 'FIXED' as const,
        startAt: new Date(Date.now() - 2 * HOUR).toISOString(),
        endAt: new Date(Date.now() + HOUR).toISOString(),
      };
      const body = couponBody(t.ended ? { ...t.body, validity } : t.body);
      const created = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body });
      expect(created.status).toBe(201);
      templateIds.push(created.body.id as string);
    }
    // No request has read the ended template since its creation, so the server reads it as changed here.
    await fdb.db.query(`UPDATE coupon SET validity_end_at = UTC_TIMESTAMP(3) - INTERVAL 1 HOUR WHERE id = ?`, [templateIds[ENDED]]);
  });
  afterAll(async () => {
    figures.violations = (await checkInvariants(fdb.db)).length;
    report({ scenario: 'randomized model test', ...figures });
    await server?.stop();
    await fdb?.close();
  });

  const send = (method: string, path: string, token: string, body?: unknown, headers?: Record<string, string>) => {
    figures.requests++;
    return call(server.url, method, path, { token, body, headers });
  };
  const pick = <T>(items: readonly T[], i: number): T | undefined => (items.length === 0 ? undefined : items[i % items.length]);

  /** Runs one command and checks the answer against the model; returns a description of any mismatch. */
  async function step(m: UserModel, c: Command): Promise<string | null> {
    const token = tokenFor(m.user);
    const check = (r: Reply, ok: boolean, what: string) => (ok ? null : `${m.user} ${what}: got ${r.status} ${JSON.stringify(r.body)}`);
    switch (c.t) {
      case 'grab': {
        const key = (c.reuseKey === null ? undefined : pick([...m.keys.keys()], c.reuseKey)) ?? m.fresh('key');
        const earlier = m.keys.get(key);
        const r = await send('POST', `/coupons/${templateIds[c.template]}/grab`, token, undefined, { 'idempotency-key': key });
        if (earlier?.id) {
          if (earlier.template !== c.template)
            return check(r, r.status === 422 && r.body.code === 'IDEMPOTENCY_KEY_REUSED', `grab reusing ${key} for another coupon`);
          return check(r, r.status === 201 && r.body.id === earlier.id && r.headers['idempotent-replayed'] === 'true', `replay of ${key}`);
        }
        const t = TEMPLATES[c.template];
        if (t.ended) {
          m.keys.set(key, { template: c.template, id: null });
          return check(r, r.status === 409 && r.body.code === 'GRAB_ENDED', `grab of ${t.name} with ${key}`);
        }
        const limitReached = m.grabbed(c.template) >= (t.body.perUserLimit ?? 1);
        if (r.status === 409 && r.body.code === 'SOLD_OUT' && t.scarce) {
          soldOutSeen.add(c.template);
          m.keys.set(key, { template: c.template, id: null });
          return null;
        }
        if (limitReached) {
          m.keys.set(key, { template: c.template, id: null });
          return check(r, r.status === 409 && r.body.code === 'USER_LIMIT_REACHED', `grab over the limit with ${key}`);
        }
        if (r.status !== 201 || r.body.status !== t.born || r.body.source !== 'GRAB')
          return check(r, false, `grab of ${t.name} with ${key}`);
        m.keys.set(key, { template: c.template, id: r.body.id as string });
        m.coupons.push({ id: r.body.id as string, template: c.template, status: t.born, source: 'GRAB' });
        return null;
      }
      case 'redeem':
      case 'confirm': {
        let uc: ModelCoupon | undefined;
        let orderNo: string;
        let cents: number;
        if (c.t === 'confirm') {
          const h = pick([...m.holds.values()], c.pick);
          if (!h) return null;
          uc = m.coupons.find((x) => x.id === h.couponId);
          orderNo = h.orderNo;
          cents = c.sameCents ? h.cents : h.cents + 1;
        } else {
          uc = pick(m.coupons, c.pick);
          orderNo = (c.reuseOrder === null ? undefined : pick(m.allOrders(), c.reuseOrder)) ?? m.fresh('order');
          cents = c.cents;
        }
        if (!uc) return null;
        const key = `${orderNo}/${uc.id}`;
        const r = await send('POST', '/redemptions', token, { userCouponId: uc.id, orderNo, orderAmountCents: cents });
        const prior = m.redemptions.get(key);
        if (prior && m.redeemedCents.get(key) !== cents)
          return check(
            r,
            r.status === 422 && r.body.code === 'IDEMPOTENCY_KEY_REUSED',
            `repeat of order ${orderNo} on ${uc.id} with another amount`,
          );
        if (prior)
          return check(
            r,
            r.status === 200 && r.body.redemptionId === prior && r.body.firstUse === false && r.headers['idempotent-replayed'] === 'true',
            `repeat of order ${orderNo} on ${uc.id}`,
          );
        const hold = m.holds.get(key);
        let code: string | null;
        if (hold) {
          const seen = m.holdStatus(hold);
          code =
            seen.status === 'RELEASED'
              ? seen.releaseReason === 'TIMEOUT'
                ? 'HOLD_EXPIRED'
                : 'HOLD_RELEASED'
              : cents !== hold.cents
                ? 'HOLD_MISMATCH'
                : m.orderBook.get(orderNo)?.refunded
                  ? 'ORDER_REFUNDED'
                  : null;
        } else {
          code = refusalOf(m, uc, orderNo, cents);
        }
        if (code === 'HOLD_EXPIRED') figures.holdsSeenTimedOut++;
        if (code)
          return check(
            r,
            r.body.code === code && r.status === STATUS_OF[code],
            `redeem of ${m.statusOf(uc)} ${uc.id} on ${orderNo}, expected ${code}`,
          );
        const discount = hold?.discountCents ?? DISCOUNT;
        if (r.status !== 201 || r.body.firstUse !== true || r.body.discountCents !== discount)
          return check(r, false, `redeem of ${uc.id} on ${orderNo}${hold ? ' confirming its hold' : ''}`);
        if (hold) {
          hold.status = 'CONFIRMED';
          figures.holdsConfirmed++;
        } else if (uc.heldBy) Object.assign(uc.heldBy, { status: 'RELEASED', releaseReason: 'TIMEOUT' });
        uc.status = 'USED';
        uc.heldBy = undefined;
        m.redemptions.set(key, r.body.redemptionId as string);
        m.redeemedCents.set(key, cents);
        m.orders.push({ orderNo, couponId: uc.id });
        // An order with no coupon on it takes the amount of the next one (none of these templates stack).
        m.orderBook.set(orderNo, { cents, refunded: false });
        return null;
      }
      case 'hold': {
        const usable = c.usable ? m.coupons.filter((x) => m.statusOf(x) === 'UNUSED' && !TEMPLATES[x.template].notYetValid) : [];
        const uc = pick(usable, c.pick) ?? pick(m.coupons, c.pick);
        if (!uc) return null;
        const fresh = usable.length > 0;
        const orderNo = (c.reuseOrder === null || fresh ? undefined : pick(m.allOrders(), c.reuseOrder)) ?? m.fresh('order');
        const cents = fresh ? THRESHOLD * 2 : c.cents;
        const key = `${orderNo}/${uc.id}`;
        const body = { userCouponId: uc.id, orderNo, orderAmountCents: cents, ttlSeconds: c.short ? SHORT_TTL : LONG_TTL };
        const r = await send('POST', '/redemptions/holds', token, body);
        const earlier = m.holds.get(key);
        if (earlier) {
          if (earlier.cents !== cents)
            return check(r, r.status === 422 && r.body.code === 'IDEMPOTENCY_KEY_REUSED', `hold repeat of ${key} with another amount`);
          const seen = m.holdStatus(earlier);
          return check(
            r,
            r.status === 200 &&
              r.headers['idempotent-replayed'] === 'true' &&
              r.body.holdId === earlier.holdId &&
              r.body.status === seen.status &&
              r.body.releaseReason === seen.releaseReason,
            `hold repeat of ${key}, model says ${seen.status}`,
          );
        }
        const code = refusalOf(m, uc, orderNo, cents);
        if (code)
          return check(
            r,
            r.body.code === code && r.status === STATUS_OF[code],
            `hold of ${m.statusOf(uc)} ${uc.id} on ${orderNo}, expected ${code}`,
          );
        if (r.status !== 201 || r.body.status !== 'ACTIVE' || r.body.discountCents !== DISCOUNT) return check(r, false, `hold of ${key}`);
        if (uc.heldBy) Object.assign(uc.heldBy, { status: 'RELEASED', releaseReason: 'TIMEOUT' });
        const held: ModelHold = {
          holdId: r.body.holdId as string,
          orderNo,
          couponId: uc.id,
          cents: cents,
          discountCents: r.body.discountCents as number,
          expiresAt: Date.parse(r.body.expiresAt as string),
          status: 'ACTIVE',
          releaseReason: null,
        };
        m.holds.set(key, held);
        figures.holdsPlaced++;
        uc.status = 'LOCKED';
        uc.heldBy = held;
        m.orderBook.set(orderNo, { cents, refunded: false });
        return null;
      }
      case 'release': {
        const h = c.neverHeld ? undefined : pick([...m.holds.values()], c.pick);
        if (!h) {
          const uc = pick(m.coupons, c.pick);
          if (!uc) return null;
          const r = await send('POST', '/redemptions/holds/release', token, { userCouponId: uc.id, orderNo: m.fresh('never-held') });
          return check(r, r.status === 404 && r.body.code === 'HOLD_NOT_FOUND', `release of a hold never placed on ${uc.id}`);
        }
        const r = await send('POST', '/redemptions/holds/release', token, { userCouponId: h.couponId, orderNo: h.orderNo });
        const seen = m.holdStatus(h);
        if (seen.status === 'CONFIRMED')
          return check(r, r.status === 409 && r.body.code === 'HOLD_ALREADY_CONFIRMED', `release of confirmed ${h.holdId}`);
        const reason = seen.status === 'RELEASED' ? seen.releaseReason : 'CANCELLED';
        if (r.status !== 200 || r.body.holdId !== h.holdId || r.body.status !== 'RELEASED' || r.body.releaseReason !== reason)
          return check(r, false, `release of ${h.holdId}, model says ${seen.status}`);
        if (seen.status === 'ACTIVE') figures.holdsCancelled++;
        Object.assign(h, { status: 'RELEASED', releaseReason: reason });
        const uc = m.coupons.find((x) => x.id === h.couponId);
        if (uc?.heldBy === h) Object.assign(uc, { status: 'UNUSED', heldBy: undefined });
        return null;
      }
      case 'refund': {
        const order = c.redeemed ? pick(m.orders, c.pick) : undefined;
        const uc = order ? m.coupons.find((x) => x.id === order.couponId) : pick(m.coupons, c.pick);
        if (!uc) return null;
        const orderNo = order?.orderNo ?? m.fresh('never-redeemed');
        const reused = c.reuseRefund === null ? undefined : pick([...m.refunds.keys()], c.reuseRefund);
        const refundNo = reused ?? m.fresh('refund');
        const r = await send('POST', '/redemptions/refunds', serviceToken(), { userCouponId: uc.id, orderNo, refundNo });
        const prior = m.refunds.get(refundNo);
        if (prior) {
          const same = prior.couponId === uc.id && prior.orderNo === orderNo;
          return same
            ? check(r, r.status === 201 && r.body.replacementUserCoupon?.id === prior.replacementId, `replay of refund ${refundNo}`)
            : check(r, r.status === 422 && r.body.code === 'IDEMPOTENCY_KEY_REUSED', `refund ${refundNo} reused for another order`);
        }
        if (!m.redemptions.has(`${orderNo}/${uc.id}`))
          return check(r, r.status === 409 && r.body.code === 'NOT_REDEEMED', `refund of unredeemed ${uc.id}`);
        const earlierReplacement = m.refundedRedemptions.get(`${orderNo}/${uc.id}`);
        if (earlierReplacement)
          return check(r, r.status === 201 && r.body.replacementUserCoupon?.id === earlierReplacement, `second refund of ${orderNo}`);
        if (!TEMPLATES[uc.template].body.returnOnRefund)
          return check(r, r.status === 409 && r.body.code === 'REFUND_RETURN_DISABLED', `refund of ${uc.id} without return`);
        const replacement = r.body.replacementUserCoupon as { id: string; status: string; source: string } | null | undefined;
        if (
          r.status !== 201 ||
          !replacement ||
          replacement.source !== 'REFUND_RETURN' ||
          replacement.status !== TEMPLATES[uc.template].born
        )
          return check(r, false, `refund ${refundNo}`);
        m.refunds.set(refundNo, { couponId: uc.id, orderNo, replacementId: replacement.id });
        (m.orderBook.get(orderNo) as { refunded: boolean }).refunded = true;
        m.refundedRedemptions.set(`${orderNo}/${uc.id}`, replacement.id);
        m.coupons.push({ id: replacement.id, template: uc.template, status: TEMPLATES[uc.template].born, source: 'REFUND_RETURN' });
        return null;
      }
      case 'void': {
        const uc = pick(m.coupons, c.pick);
        if (!uc) return null;
        const r = await send('POST', `/admin/user-coupons/${uc.id}/void`, adminToken(), { reason: 'model test' });
        const status = m.statusOf(uc);
        if (status === 'USED' || status === 'VOID')
          return check(r, r.status === 409 && r.body.code === 'ILLEGAL_TRANSITION', `void of ${status} ${uc.id}`);
        if (status === 'LOCKED') return check(r, r.status === 409 && r.body.code === 'COUPON_LOCKED', `void of held ${uc.id}`);
        if (r.status !== 200 || r.body.status !== 'VOID') return check(r, false, `void of ${uc.id}`);
        if (uc.heldBy) Object.assign(uc.heldBy, { status: 'RELEASED', releaseReason: 'TIMEOUT' });
        uc.status = 'VOID';
        uc.heldBy = undefined;
        return null;
      }
      case 'reissue': {
        const t = TEMPLATES[c.template];
        const reissue = (template: number) =>
          send('POST', '/admin/user-coupons/reissue', adminToken(), {
            couponId: templateIds[template],
            userId: m.user,
            reason: 'model test',
            fromStock: false,
          });
        const r = await reissue(c.template);
        if (t.ended) {
          // No coupon is issued born EXPIRED. The client's expired coupon is one whose validity ran out after
          // its issue: reissued of a valid template, its expiresAt then moved into the past as the clock would.
          if (r.status !== 409 || r.body.code !== 'COUPON_EXPIRED') return check(r, false, `reissue of ${t.name}`);
          const valid = await reissue(PLENTY);
          if (valid.status !== 201 || valid.body.status !== 'UNUSED') return check(valid, false, `reissue of ${TEMPLATES[PLENTY].name}`);
          await fdb.db.query(`UPDATE user_coupon SET expires_at = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND WHERE id = ?`, [valid.body.id]);
          m.coupons.push({ id: valid.body.id as string, template: PLENTY, status: 'EXPIRED', source: 'REISSUE' });
          return null;
        }
        if (r.status !== 201 || r.body.status !== t.born || r.body.source !== 'REISSUE') return check(r, false, `reissue of ${t.name}`);
        m.coupons.push({ id: r.body.id as string, template: c.template, status: t.born, source: 'REISSUE' });
        return null;
      }
      case 'read': {
        const uc = pick(m.coupons, c.pick);
        if (!uc) return null;
        // A hold may time out while the read is under way: the server answers as of some moment between.
        const before = m.statusOf(uc);
        const r = await send('GET', `/me/coupons/${uc.id}`, token);
        const after = m.statusOf(uc);
        const says = before === after ? before : `${before} or ${after}`;
        return check(r, r.status === 200 && (r.body.status === before || r.body.status === after), `read of ${uc.id}, model says ${says}`);
      }
      case 'pause':
        await sleep(SHORT_TTL * 1000);
        return null;
      case 'reconcile': {
        const r = await send('POST', '/admin/reconciliation/runs', adminToken(), { mode: 'FULL' });
        if (r.status === 202) figures.reconcileRunsDuringLoad++;
        return check(r, r.status === 202 || (r.status === 409 && r.body.code === 'RECONCILIATION_RUNNING'), 'reconciliation start');
      }
    }
  }

  /** The database, per user, against the model: the same coupons, statuses and redemptions. */
  async function compare(models: UserModel[]): Promise<string[]> {
    const wrong: string[] = [];
    for (const m of models) {
      const rows = (await fdb.db.query(
        `SELECT id, status, source, expires_at <= UTC_TIMESTAMP(3) AS past, locked_until <= UTC_TIMESTAMP(3) AS released
         FROM user_coupon WHERE user_id = ? ORDER BY id`,
        [m.user],
      )) as { id: string; status: Status; source: string; past: string | number; released: string | number | null }[];
      const shown = (r: (typeof rows)[number]): Status =>
        r.status === 'LOCKED' && Number(r.released) === 1
          ? Number(r.past) === 1
            ? 'EXPIRED'
            : 'UNUSED'
          : r.status === 'UNUSED' && Number(r.past) === 1
            ? 'EXPIRED'
            : r.status;
      const seen = rows.map((r) => `${r.id}:${shown(r)}:${r.source}`);
      const modelled = m.coupons.map((c) => `${c.id}:${m.statusOf(c)}:${c.source}`).sort();
      if (JSON.stringify(seen.sort()) !== JSON.stringify(modelled))
        wrong.push(`${m.user}: database ${JSON.stringify(seen)} model ${JSON.stringify(modelled)}`);
      const redemptions = (await fdb.db.query(`SELECT id, order_no, user_coupon_id FROM redemption WHERE user_id = ?`, [m.user])) as {
        id: string;
        order_no: string;
        user_coupon_id: string;
      }[];
      const stored = redemptions.map((r) => `${r.order_no}/${r.user_coupon_id}=${r.id}`).sort();
      const expected = [...m.redemptions].map(([k, v]) => `${k}=${v}`).sort();
      if (JSON.stringify(stored) !== JSON.stringify(expected))
        wrong.push(`${m.user}: redemptions ${JSON.stringify(stored)} model ${JSON.stringify(expected)}`);
      const holds = (await fdb.db.query(
        `SELECT id, order_no, user_coupon_id, status, release_reason, expires_at <= UTC_TIMESTAMP(3) AS past FROM redemption_hold WHERE user_id = ?`,
        [m.user],
      )) as {
        id: string;
        order_no: string;
        user_coupon_id: string;
        status: string;
        release_reason: string | null;
        past: string | number;
      }[];
      const storedHolds = holds
        .map((h) =>
          h.status === 'ACTIVE' && Number(h.past) === 1
            ? `${h.order_no}/${h.user_coupon_id}=${h.id}:RELEASED:TIMEOUT`
            : `${h.order_no}/${h.user_coupon_id}=${h.id}:${h.status}:${h.release_reason}`,
        )
        .sort();
      const modelHolds = [...m.holds]
        .map(([k, h]) => {
          const seenHold = m.holdStatus(h);
          return `${k}=${h.holdId}:${seenHold.status}:${seenHold.releaseReason}`;
        })
        .sort();
      if (JSON.stringify(storedHolds) !== JSON.stringify(modelHolds))
        wrong.push(`${m.user}: holds ${JSON.stringify(storedHolds)} model ${JSON.stringify(modelHolds)}`);
    }
    return wrong;
  }

  it('every answer matches the model, and so does the database at the end of each run', async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.array(command, { minLength: 40, maxLength: 60 }), { minLength: CLIENTS, maxLength: CLIENTS }),
        async (programs) => {
          run++;
          const models = programs.map((_, i) => new UserModel(`model-${run}-${i}`));
          const mismatches: string[] = [];
          await Promise.all(
            programs.map(async (program, i) => {
              // Each client starts with coupons it can hold, so the program's holds have something to hold, and
              // tries the scarce one, which the clients together sell out; an operator tries to reissue it one of the
              // ended template (refused) and gives it one whose validity then runs out.
              const stocked: Command[] = [
                ...[SCARCE, ...Array.from({ length: STARTING_COUPONS }, () => PLENTY)].map((template) => ({
                  t: 'grab' as const,
                  template,
                  reuseKey: null,
                })),
                { t: 'reissue', template: ENDED },
              ];
              for (const c of [...stocked, ...program]) {
                figures.commands++;
                await models[i].settle();
                const wrong = await step(models[i], c);
                if (wrong) mismatches.push(wrong);
              }
            }),
          );
          expect(mismatches).toEqual([]);
          // Past every short hold's expiry (and its edge), so the database and the model agree on which timed out.
          const lastShort = Math.max(
            0,
            ...models.flatMap((mm) => [...mm.holds.values()].map((h) => h.expiresAt).filter((at) => at <= Date.now() + SHORT_TTL * 1000)),
          );
          if (lastShort + EDGE_MS > Date.now()) await sleep(lastShort + EDGE_MS - Date.now());
          expect(await compare(models)).toEqual([]);
          // The sweep (every second) stores every timeout: none ACTIVE past its time, none LOCKED past it.
          const users = models.map((mm) => mm.user);
          const overdue = async () =>
            count(
              fdb.db,
              `SELECT (SELECT COUNT(*) FROM redemption_hold WHERE user_id IN (?) AND status = 'ACTIVE' AND expires_at <= UTC_TIMESTAMP(3))
                    + (SELECT COUNT(*) FROM user_coupon WHERE user_id IN (?) AND status = 'LOCKED' AND locked_until <= UTC_TIMESTAMP(3)) AS n`,
              [users, users],
            );
          const swept = Date.now() + 10_000;
          while ((await overdue()) > 0 && Date.now() < swept) await sleep(200);
          expect(await overdue()).toBe(0);
          expect(await compare(models)).toEqual([]);
          const timedOut = models.flatMap((mm) => [...mm.holds.values()].filter((h) => mm.holdStatus(h).releaseReason === 'TIMEOUT'));
          expect(
            await count(fdb.db, `SELECT COUNT(*) AS n FROM redemption_hold WHERE user_id IN (?) AND release_reason = 'TIMEOUT'`, [users]),
          ).toBe(timedOut.length);
          figures.holdsTimedOut += timedOut.length;
          return true;
        },
      ),
      { numRuns: RUNS, endOnFailure: true },
    );
  });

  it('stock adds up over all clients, a sold-out coupon is really out, and reconciliation finds nothing', async () => {
    for (const [i, id] of templateIds.entries()) {
      const grabbed = await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND source = 'GRAB'`, [id]);
      const remaining = await count(fdb.db, `SELECT stock AS n FROM coupon_stock WHERE coupon_id = ?`, [id]);
      expect(remaining).toBe((TEMPLATES[i].body.totalStock as number) - grabbed);
      if (soldOutSeen.has(i)) expect(remaining).toBe(0);
    }
    expect(soldOutSeen.has(0)).toBe(true);
    // Let runs started by the clients finish, then one more over the final state.
    let started: Reply;
    for (;;) {
      started = await send('POST', '/admin/reconciliation/runs', adminToken(), { mode: 'FULL' });
      if (started.status === 202) break;
      await sleep(200);
    }
    let run: Reply;
    do {
      await sleep(200);
      run = await send('GET', `/admin/reconciliation/runs/${started.body.runId}`, adminToken());
    } while (run.body.status === 'RUNNING');
    expect([run.body.status, run.body.discrepancies]).toEqual(['COMPLETED', 0]);
    figures.discrepanciesDuringLoad = await count(
      fdb.db,
      `SELECT COALESCE(SUM(discrepancies), 0) AS n FROM reconciliation_run WHERE id <> ?`,
      [started.body.runId],
    );
    expect(figures.discrepanciesDuringLoad).toBe(0);
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });

  it('many holds timed out, and the sweep released a good share of them while the clients ran', async () => {
    figures.holdsReleasedBySweep = await count(
      fdb.db,
      `SELECT COUNT(*) AS n FROM user_coupon_state_log WHERE from_status = 'LOCKED' AND tx_id LIKE 'hold-sweep:%'`,
    );
    expect(figures.holdsTimedOut).toBeGreaterThanOrEqual(50);
    expect(figures.holdsReleasedBySweep).toBeGreaterThanOrEqual(20);
    expect(figures.holdsReleasedBySweep).toBeLessThanOrEqual(figures.holdsTimedOut);
  });
});
