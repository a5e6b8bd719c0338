import { SchedulerRegistry } from '@nestjs/schedule';
import { CronJob } from 'cron';
import request from 'supertest';
import { everySeconds } from '../src/common/cron-job.js';
import { HOLD_SWEEP_JOB } from '../src/redemption/hold-sweep.cron.job.js';
import { tryAcquireLease } from '../src/database/lease.js';
import { HOLD_SWEEP_LEASE, HoldSweepService } from '../src/redemption/hold-sweep.service.js';
import { createCoupon, CouponInput, grabUserCoupon, newKey, newUserCoupon } from './support/factories.js';
import { TransactionService } from '../src/database/transaction.service.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { countByStatus } from '../src/ledger/user-coupons.js';
import { databaseFingerprint } from './support/fingerprint.js';
import { ORDER_LOCK_STRIPES } from '../src/redemption/order.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('checkout holds', () => {
  let t: TestApp;
  let seq = 0;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterEach(async () => {
    expect(await checkInvariants(t.db)).toEqual([]);
  });
  afterAll(() => t.close());

  const order = () => `ORD-${process.pid}-${++seq}`;
  const userCoupon = (userId: string, overrides: CouponInput = {}) => newUserCoupon(t.url, userId, overrides);
  const hold = (token: string, body: Record<string, unknown>) => request(t.url).post('/redemptions/holds').set(bearer(token)).send(body);
  const release = (token: string, body: Record<string, unknown>) =>
    request(t.url).post('/redemptions/holds/release').set(bearer(token)).send(body);
  const redeem = (token: string, body: Record<string, unknown>) => request(t.url).post('/redemptions').set(bearer(token)).send(body);
  const mine = async (userId: string, id: string) =>
    (
      await request(t.url)
        .get(`/me/coupons/${id}`)
        .set(bearer(tokenFor(userId)))
    ).body;
  const stored = async (id: string) =>
    ((await t.db.query(`SELECT status FROM user_coupon WHERE id = ?`, [id])) as { status: string }[])[0].status;
  const steps = async (id: string) =>
    (
      (await t.db.query(`SELECT from_status, to_status FROM user_coupon_state_log WHERE user_coupon_id = ? ORDER BY id`, [id])) as {
        from_status: string | null;
        to_status: string;
      }[]
    ).map((l) => `${l.from_status}>${l.to_status}`);
  const holdRow = async (orderNo: string, ucId: string) =>
    (
      (await t.db.query(`SELECT status, release_reason FROM redemption_hold WHERE order_no = ? AND user_coupon_id = ?`, [
        orderNo,
        ucId,
      ])) as {
        status: string;
        release_reason: string | null;
      }[]
    )[0];
  const counts = async (couponId: string) => (await request(t.url).get(`/admin/coupons/${couponId}`).set(bearer(adminToken()))).body.counts;
  const sweep = () => t.app.get(HoldSweepService).runExclusive();

  it('holds a coupon for an order: 201 Hold, the coupon LOCKED everywhere, counted as locked, one log row', async () => {
    const uc = await userCoupon('alice');
    const orderNo = order();
    const before = Date.now();
    const res = await hold(tokenFor('alice'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000, ttlSeconds: 600 });
    expect(res.status).toBe(201);
    expect(res.headers['idempotent-replayed']).toBeUndefined();
    expect(res.body).toEqual({
      holdId: expect.any(String),
      userCouponId: uc.id,
      orderNo,
      userId: 'alice',
      discountCents: 1000,
      status: 'ACTIVE',
      expiresAt: expect.any(String),
      createdAt: expect.any(String),
      releasedAt: null,
      releaseReason: null,
    });
    const ttl = Date.parse(res.body.expiresAt) - before;
    expect(ttl).toBeGreaterThanOrEqual(600_000 - 50);
    expect(ttl).toBeLessThan(605_000);
    expect((await mine('alice', uc.id)).status).toBe('LOCKED');
    const list = await request(t.url)
      .get('/me/coupons?status=LOCKED')
      .set(bearer(tokenFor('alice')));
    expect(list.body.items.map((i: { id: string }) => i.id)).toEqual([uc.id]);
    expect(await counts(uc.couponId)).toEqual({ issued: 1, issuedFromStock: 1, unused: 0, locked: 1, used: 0, expired: 0, void: 0 });
    expect(await steps(uc.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED']);
    const log = (await t.db.query(`SELECT tx_id FROM user_coupon_state_log WHERE user_coupon_id = ? ORDER BY id DESC LIMIT 1`, [
      uc.id,
    ])) as { tx_id: string }[];
    expect(log[0].tx_id).toBe(`hold:${orderNo}`);
  });

  it('defaults to HOLD_TTL_SECONDS (900 s)', async () => {
    const uc = await userCoupon('ttl');
    const before = Date.now();
    const res = await hold(tokenFor('ttl'), { userCouponId: uc.id, orderNo: order(), orderAmountCents: 20000 });
    const ttl = Date.parse(res.body.expiresAt) - before;
    expect(ttl).toBeGreaterThanOrEqual(900_000 - 50);
    expect(ttl).toBeLessThan(905_000);
  });

  it('a repeat answers the hold as it is now (200, Idempotent-Replayed); another amount 422; another order 409 COUPON_LOCKED', async () => {
    const uc = await userCoupon('bob');
    const orderNo = order();
    const body = { userCouponId: uc.id, orderNo, orderAmountCents: 20000 };
    const first = await hold(tokenFor('bob'), body);
    const again = await hold(serviceToken(), { ...body, userId: 'bob' });
    expect([again.status, again.headers['idempotent-replayed']]).toEqual([200, 'true']);
    expect(again.body).toEqual(first.body);
    const fingerprint = await databaseFingerprint(t.db);
    const amount = await hold(tokenFor('bob'), { ...body, orderAmountCents: 30000 });
    expect([amount.status, amount.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    const other = await hold(tokenFor('bob'), { ...body, orderNo: order() });
    expect([other.status, other.body.code]).toEqual([409, 'COUPON_LOCKED']);
    const plain = await redeem(tokenFor('bob'), { ...body, orderNo: order() });
    expect([plain.status, plain.body.code]).toEqual([409, 'COUPON_LOCKED']);
    const stranger = await hold(tokenFor('mallory'), body);
    expect([stranger.status, stranger.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    // Released, a repeat still answers that hold (RELEASED), it does not hold again.
    expect((await release(tokenFor('bob'), { userCouponId: uc.id, orderNo })).status).toBe(200);
    const afterRelease = await hold(tokenFor('bob'), body);
    expect([afterRelease.status, afterRelease.body.status, afterRelease.body.releaseReason]).toEqual([200, 'RELEASED', 'CANCELLED']);
    expect(await stored(uc.id)).toBe('UNUSED');
  });

  it('checks like a redemption: threshold, expired, void, not yet valid, used, writing nothing', async () => {
    const uc = await userCoupon('carol');
    const fingerprint = await databaseFingerprint(t.db);
    const below = await hold(tokenFor('carol'), { userCouponId: uc.id, orderNo: order(), orderAmountCents: 9999 });
    expect([below.status, below.body.code]).toEqual([422, 'THRESHOLD_NOT_MET']);
    const missing = await hold(tokenFor('carol'), { userCouponId: '987654321', orderNo: order(), orderAmountCents: 20000 });
    expect([missing.status, missing.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    const future = await userCoupon('carol', {
      validity: {
        type: 'FIXED',
        startAt: new Date(Date.now() + 86_400_000).toISOString(),
        endAt: new Date(Date.now() + 2 * 86_400_000).toISOString(),
      },
    });
    const early = await hold(tokenFor('carol'), { userCouponId: future.id, orderNo: order(), orderAmountCents: 20000 });
    expect([early.status, early.body.code]).toEqual([409, 'COUPON_NOT_YET_VALID']);
    const used = await userCoupon('carol');
    expect((await redeem(tokenFor('carol'), { userCouponId: used.id, orderNo: order(), orderAmountCents: 20000 })).status).toBe(201);
    const again = await hold(tokenFor('carol'), { userCouponId: used.id, orderNo: order(), orderAmountCents: 20000 });
    expect([again.status, again.body.code]).toEqual([409, 'COUPON_ALREADY_USED']);
    const expiring = await userCoupon('carol');
    await t.db.query(`UPDATE user_coupon SET expires_at = ? WHERE id = ?`, [new Date(Date.now() - 1000), expiring.id]);
    const expired = await hold(tokenFor('carol'), { userCouponId: expiring.id, orderNo: order(), orderAmountCents: 20000 });
    expect([expired.status, expired.body.code]).toEqual([409, 'COUPON_EXPIRED']);
    const voided = await userCoupon('carol');
    await request(t.url).post(`/admin/user-coupons/${voided.id}/void`).set(bearer(adminToken())).send({ reason: 'test' });
    const isVoid = await hold(tokenFor('carol'), { userCouponId: voided.id, orderNo: order(), orderAmountCents: 20000 });
    expect([isVoid.status, isVoid.body.code]).toEqual([409, 'COUPON_VOID']);
    expect(Number(((await t.db.query(`SELECT COUNT(*) AS n FROM redemption_hold`)) as { n: string }[])[0].n)).toBe(
      Number(((await t.db.query(`SELECT COUNT(*) AS n FROM redemption_hold WHERE user_id <> 'carol'`)) as { n: string }[])[0].n),
    );
  });

  it('confirmation: the redemption of the pair makes it USED with the hold discount; another amount 422 HOLD_MISMATCH; then release 409', async () => {
    const uc = await userCoupon('dave', { discount: { thresholdCents: 10000, amountCents: 1000 } });
    const orderNo = order();
    await hold(tokenFor('dave'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
    const fingerprint = await databaseFingerprint(t.db);
    const mismatch = await redeem(tokenFor('dave'), { userCouponId: uc.id, orderNo, orderAmountCents: 25000 });
    expect([mismatch.status, mismatch.body.code]).toEqual([422, 'HOLD_MISMATCH']);
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    const ok = await redeem(serviceToken(), { userCouponId: uc.id, orderNo, orderAmountCents: 20000, userId: 'dave' });
    expect(ok.status).toBe(201);
    expect(ok.body).toMatchObject({ userCouponId: uc.id, orderNo, userId: 'dave', discountCents: 1000, status: 'USED', firstUse: true });
    const replay = await redeem(tokenFor('dave'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
    expect([replay.status, replay.body.firstUse, replay.body.redemptionId]).toEqual([200, false, ok.body.redemptionId]);
    expect(await steps(uc.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>USED']);
    expect(await holdRow(orderNo, uc.id)).toEqual({ status: 'CONFIRMED', release_reason: null });
    const held = await hold(tokenFor('dave'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
    expect([held.status, held.body.status]).toEqual([200, 'CONFIRMED']);
    const late = await release(tokenFor('dave'), { userCouponId: uc.id, orderNo });
    expect([late.status, late.body.code]).toEqual([409, 'HOLD_ALREADY_CONFIRMED']);
    expect(await counts(uc.couponId)).toMatchObject({ locked: 0, used: 1 });
  });

  it('release: RELEASED (CANCELLED), coupon UNUSED; repeats answer the same; confirmation after it 409 HOLD_RELEASED; unknown 404', async () => {
    const uc = await userCoupon('erin');
    const orderNo = order();
    await hold(tokenFor('erin'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
    const res = await release(tokenFor('erin'), { userCouponId: uc.id, orderNo });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ userCouponId: uc.id, orderNo, status: 'RELEASED', releaseReason: 'CANCELLED' });
    expect(typeof res.body.releasedAt).toBe('string');
    const again = await release(serviceToken(), { userCouponId: uc.id, orderNo, userId: 'erin' });
    expect([again.status, again.headers['idempotent-replayed']]).toEqual([200, 'true']);
    expect(again.body).toEqual(res.body);
    expect(await stored(uc.id)).toBe('UNUSED');
    expect(await steps(uc.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>UNUSED']);
    const fingerprint = await databaseFingerprint(t.db);
    const confirm = await redeem(tokenFor('erin'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
    expect([confirm.status, confirm.body.code]).toEqual([409, 'HOLD_RELEASED']);
    for (const [token, body] of [
      [tokenFor('erin'), { userCouponId: uc.id, orderNo: 'never-held' }],
      [tokenFor('erin'), { userCouponId: '987654321', orderNo }],
      [tokenFor('someone-else'), { userCouponId: uc.id, orderNo }],
    ] as const) {
      const r = await release(token, body);
      expect([r.status, r.body.code]).toEqual([404, 'HOLD_NOT_FOUND']);
    }
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    // The coupon is free again: another order can use it.
    expect((await redeem(tokenFor('erin'), { userCouponId: uc.id, orderNo: order(), orderAmountCents: 20000 })).status).toBe(201);
  });

  it('an order number with a trailing space is another order: its release leaves the hold alone, its hold is refused', async () => {
    const uc = await userCoupon('trailing');
    const orderNo = order();
    expect((await hold(tokenFor('trailing'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 })).status).toBe(201);
    const released = await release(tokenFor('trailing'), { userCouponId: uc.id, orderNo: `${orderNo} ` });
    expect([released.status, released.body.code]).toEqual([404, 'HOLD_NOT_FOUND']);
    const other = await hold(tokenFor('trailing'), { userCouponId: uc.id, orderNo: `${orderNo} `, orderAmountCents: 20000 });
    expect([other.status, other.body.code]).toEqual([409, 'COUPON_LOCKED']);
    expect(await holdRow(orderNo, uc.id)).toEqual({ status: 'ACTIVE', release_reason: null });
    expect(await stored(uc.id)).toBe('LOCKED');
  });

  /**
   * What `send` answers while another transaction holds the row `lockSql` locks, until `until` (ms
   * since the epoch): the request waits for the row, as behind a slow request on the same order or coupon.
   */
  const whileLocked = async <T>(lockSql: string, params: unknown[], until: number, send: () => PromiseLike<T>): Promise<T> => {
    const runner = t.db.createQueryRunner();
    await runner.connect();
    await runner.startTransaction();
    try {
      await runner.query(lockSql, params);
      // then(): supertest sends only once asked for its answer.
      const answer = Promise.resolve(send()).then((r) => r);
      await sleep(until - Date.now());
      await runner.commitTransaction();
      return await answer;
    } finally {
      if (runner.isTransactionActive) await runner.rollbackTransaction();
      await runner.release();
    }
  };
  const LOCK_ORDER = `SELECT order_no FROM coupon_order WHERE order_no = ? FOR UPDATE`;
  const LOCK_COUPON = `SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`;
  const LOCK_STRIPE = `SELECT stripe FROM coupon_order_lock WHERE stripe = CRC32(?) % ${ORDER_LOCK_STRIPES} FOR UPDATE`;

  it("a confirmation that waited for the order's lock past the hold's time is 409 HOLD_EXPIRED: the time is read after the wait", async () => {
    const uc = await userCoupon('waiter');
    const orderNo = order();
    const held = await hold(tokenFor('waiter'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000, ttlSeconds: 2 });
    expect(held.status).toBe(201);
    // Another transaction on the order (another coupon being added) holds its lock across the hold's end.
    const confirmed = await whileLocked(LOCK_ORDER, [orderNo], Date.parse(held.body.expiresAt) + 200, () =>
      redeem(tokenFor('waiter'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 }),
    );
    expect([confirmed.status, confirmed.body.code]).toEqual([409, 'HOLD_EXPIRED']);
    expect(await stored(uc.id)).not.toBe('USED');
  });

  it("a release sent while the order's hold is still being placed waits for it and releases it: the cancelled order keeps no coupon", async () => {
    const uc = await userCoupon('lost-hold');
    const orderNo = order();
    // Another request of the order holds its lock; the hold queues behind it, and the order service,
    // its answer late, cancels the order: the release is sent after the hold.
    let released: request.Response | undefined;
    const placed = await whileLocked(LOCK_STRIPE, [orderNo], Date.now() + 1500, async () => {
      const placing = hold(tokenFor('lost-hold'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 }).then((r) => r);
      await sleep(300);
      const releasing = release(tokenFor('lost-hold'), { userCouponId: uc.id, orderNo }).then((r) => (released = r));
      return Promise.all([placing, releasing]).then(([p]) => p);
    });
    expect([placed.status, placed.body.status]).toEqual([201, 'ACTIVE']);
    expect([released?.status, released?.body.releaseReason]).toEqual([200, 'CANCELLED']);
    expect(await stored(uc.id)).toBe('UNUSED');
  });

  describe("a request that waited for the coupon's row reads the time once it has it", () => {
    it('a hold placed after the wait lasts its whole time: ACTIVE, not born timed out', async () => {
      const uc = await userCoupon('late-hold');
      const orderNo = order();
      const placed = await whileLocked(LOCK_COUPON, [uc.id], Date.now() + 2500, () =>
        hold(tokenFor('late-hold'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000, ttlSeconds: 1 }),
      );
      const answeredAt = Date.now();
      expect([placed.status, placed.body.status, placed.body.releaseReason]).toEqual([201, 'ACTIVE', null]);
      expect(Date.parse(placed.body.expiresAt) - answeredAt).toBeGreaterThan(500);
      const confirmed = await redeem(tokenFor('late-hold'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
      expect(confirmed.status).toBe(201);
    });

    it("a confirmation that gets the coupon past the hold's time is 409 HOLD_EXPIRED, and another order holds it", async () => {
      const uc = await userCoupon('late-confirm');
      const orderNo = order();
      const held = await hold(tokenFor('late-confirm'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000, ttlSeconds: 2 });
      expect(held.status).toBe(201);
      const confirmed = await whileLocked(LOCK_COUPON, [uc.id], Date.parse(held.body.expiresAt) + 300, () =>
        redeem(tokenFor('late-confirm'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 }),
      );
      expect([confirmed.status, confirmed.body.code]).toEqual([409, 'HOLD_EXPIRED']);
      const other = await hold(tokenFor('late-confirm'), { userCouponId: uc.id, orderNo: order(), orderAmountCents: 20000 });
      expect([other.status, other.body.status]).toEqual([201, 'ACTIVE']);
    });

    it("a release that gets the coupon past the hold's time answers the timeout, released at the hold's end", async () => {
      const uc = await userCoupon('late-release');
      const orderNo = order();
      const held = await hold(tokenFor('late-release'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000, ttlSeconds: 2 });
      const released = await whileLocked(LOCK_COUPON, [uc.id], Date.parse(held.body.expiresAt) + 300, () =>
        release(tokenFor('late-release'), { userCouponId: uc.id, orderNo }),
      );
      expect([released.status, released.body.releaseReason, released.body.releasedAt]).toEqual([200, 'TIMEOUT', held.body.expiresAt]);
      expect(await holdRow(orderNo, uc.id)).toEqual({ status: 'RELEASED', release_reason: 'TIMEOUT' });
    });

    it("an admin void that gets the coupon past its hold's time voids it: the timed-out hold refuses nothing", async () => {
      const uc = await userCoupon('late-void');
      const held = await hold(tokenFor('late-void'), { userCouponId: uc.id, orderNo: order(), orderAmountCents: 20000, ttlSeconds: 2 });
      const voided = await whileLocked(LOCK_COUPON, [uc.id], Date.parse(held.body.expiresAt) + 300, () =>
        request(t.url).post(`/admin/user-coupons/${uc.id}/void`).set(bearer(adminToken())).send({ reason: 'fraud' }),
      );
      expect([voided.status, voided.body.status]).toEqual([200, 'VOID']);
      expect(await steps(uc.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>UNUSED', 'UNUSED>VOID']);
    });
  });

  it('a timed-out hold behaves as released before the sweep: reads UNUSED, confirmation 409 HOLD_EXPIRED, another order holds it', async () => {
    const uc = await userCoupon('frank');
    const first = order();
    await hold(tokenFor('frank'), { userCouponId: uc.id, orderNo: first, orderAmountCents: 20000, ttlSeconds: 1 });
    await sleep(1100);
    expect(await stored(uc.id)).toBe('LOCKED');
    expect((await mine('frank', uc.id)).status).toBe('UNUSED');
    expect(await counts(uc.couponId)).toMatchObject({ unused: 1, locked: 0 });
    const unused = await request(t.url)
      .get('/me/coupons?status=UNUSED')
      .set(bearer(tokenFor('frank')));
    expect(unused.body.items.map((i: { id: string }) => i.id)).toEqual([uc.id]);
    const replay = await hold(tokenFor('frank'), { userCouponId: uc.id, orderNo: first, orderAmountCents: 20000 });
    expect([replay.status, replay.body.status, replay.body.releaseReason]).toEqual([200, 'RELEASED', 'TIMEOUT']);
    expect(replay.body.releasedAt).toBe(replay.body.expiresAt);
    const fingerprint = await databaseFingerprint(t.db);
    const late = await redeem(tokenFor('frank'), { userCouponId: uc.id, orderNo: first, orderAmountCents: 20000 });
    expect([late.status, late.body.code]).toEqual([409, 'HOLD_EXPIRED']);
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    const second = order();
    const next = await hold(tokenFor('frank'), { userCouponId: uc.id, orderNo: second, orderAmountCents: 20000 });
    expect([next.status, next.body.status]).toEqual([201, 'ACTIVE']);
    expect(await holdRow(first, uc.id)).toEqual({ status: 'RELEASED', release_reason: 'TIMEOUT' });
    expect(await steps(uc.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>UNUSED', 'UNUSED>LOCKED']);
    // Still HOLD_EXPIRED once stored: the first order's hold stays what it was.
    const stillLate = await redeem(tokenFor('frank'), { userCouponId: uc.id, orderNo: first, orderAmountCents: 20000 });
    expect([stillLate.status, stillLate.body.code]).toEqual([409, 'HOLD_EXPIRED']);
    expect((await redeem(tokenFor('frank'), { userCouponId: uc.id, orderNo: second, orderAmountCents: 20000 })).status).toBe(201);
  });

  it('a release of a timed-out hold answers it (TIMEOUT) without Idempotent-Replayed, every time, swept first or not', async () => {
    const [swept, unswept] = [await userCoupon('gina'), await userCoupon('gina')];
    const [o1, o2] = [order(), order()];
    await hold(tokenFor('gina'), { userCouponId: swept.id, orderNo: o1, orderAmountCents: 20000, ttlSeconds: 1 });
    await sleep(1100);
    await sweep();
    expect(await holdRow(o1, swept.id)).toEqual({ status: 'RELEASED', release_reason: 'TIMEOUT' });
    await hold(tokenFor('gina'), { userCouponId: unswept.id, orderNo: o2, orderAmountCents: 20000, ttlSeconds: 1 });
    await sleep(1100);
    for (const [uc, orderNo] of [
      [swept.id, o1],
      [unswept.id, o2],
      [swept.id, o1],
      [unswept.id, o2],
    ]) {
      const res = await release(tokenFor('gina'), { userCouponId: uc, orderNo });
      expect([orderNo, res.status, res.body.releaseReason, res.headers['idempotent-replayed']]).toEqual([
        orderNo,
        200,
        'TIMEOUT',
        undefined,
      ]);
    }
  });

  it('a plain redemption by another order takes a coupon whose hold timed out; a void too', async () => {
    const a = await userCoupon('gina');
    const b = await userCoupon('gina');
    for (const uc of [a, b])
      await hold(tokenFor('gina'), { userCouponId: uc.id, orderNo: order(), orderAmountCents: 20000, ttlSeconds: 600 });
    const voidLocked = await request(t.url).post(`/admin/user-coupons/${b.id}/void`).set(bearer(adminToken())).send({ reason: 'fraud' });
    expect([voidLocked.status, voidLocked.body.code]).toEqual([409, 'COUPON_LOCKED']);
    // The holds time out now: moved in SQL, as a void racing a short hold's clock failed on a busy machine.
    const past = new Date(Date.now() - 1000);
    await t.db.query(`UPDATE redemption_hold SET expires_at = ? WHERE user_coupon_id IN (?)`, [past, [a.id, b.id]]);
    await t.db.query(`UPDATE user_coupon SET locked_until = ? WHERE id IN (?)`, [past, [a.id, b.id]]);
    // Not swept yet: shown released, stored and logged LOCKED, which is consistent.
    const history = await request(t.url).get(`/admin/user-coupons/${b.id}/history`).set(bearer(adminToken()));
    expect([history.body.userCoupon.status, history.body.replayedStatus, history.body.consistent]).toEqual(['UNUSED', 'LOCKED', true]);
    expect((await redeem(tokenFor('gina'), { userCouponId: a.id, orderNo: order(), orderAmountCents: 20000 })).status).toBe(201);
    expect(await steps(a.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>UNUSED', 'UNUSED>USED']);
    const voided = await request(t.url).post(`/admin/user-coupons/${b.id}/void`).set(bearer(adminToken())).send({ reason: 'fraud' });
    expect([voided.status, voided.body.status]).toEqual([200, 'VOID']);
    expect(await steps(b.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>UNUSED', 'UNUSED>VOID']);
  });

  it('the sweep releases timed-out holds (TIMEOUT), leaves live ones, and a confirmation afterwards is 409 HOLD_EXPIRED', async () => {
    const short = await userCoupon('hank');
    const long = await userCoupon('hank');
    const [o1, o2] = [order(), order()];
    await hold(tokenFor('hank'), { userCouponId: short.id, orderNo: o1, orderAmountCents: 20000, ttlSeconds: 1 });
    await hold(tokenFor('hank'), { userCouponId: long.id, orderNo: o2, orderAmountCents: 20000, ttlSeconds: 600 });
    await sleep(1100);
    const result = await sweep();
    expect(result).toMatchObject({ complete: true });
    expect(result!.released).toBeGreaterThanOrEqual(1);
    expect([await stored(short.id), await stored(long.id)]).toEqual(['UNUSED', 'LOCKED']);
    expect(await holdRow(o1, short.id)).toEqual({ status: 'RELEASED', release_reason: 'TIMEOUT' });
    const late = await redeem(tokenFor('hank'), { userCouponId: short.id, orderNo: o1, orderAmountCents: 20000 });
    expect([late.status, late.body.code]).toEqual([409, 'HOLD_EXPIRED']);
    expect(await sweep()).toMatchObject({ released: 0, complete: true });
  });

  it("counts a coupon's user coupons by the status readers see, whatever the sweeps have not reached yet", async () => {
    const coupon = await createCoupon(t.url, { totalStock: 20, perUserLimit: 20 });
    const ucs = [];
    for (let i = 0; i < 9; i++) ucs.push(await grabUserCoupon(t.url, coupon.id, 'counted'));
    const [, unsweptExpired, used, voided, , heldPastValidity, timedOut, timedOutPastValidity, heldWithoutEnd] = ucs;
    const orders = ucs.map(() => order());
    const token = tokenFor('counted');
    expect((await redeem(token, { userCouponId: used.id, orderNo: orders[2], orderAmountCents: 20000 })).status).toBe(201);
    const voiding = await request(t.url).post(`/admin/user-coupons/${voided.id}/void`).set(bearer(adminToken())).send({ reason: 'test' });
    expect(voiding.status).toBe(200);
    for (const i of [4, 5, 6, 7, 8]) {
      expect((await hold(token, { userCouponId: ucs[i].id, orderNo: orders[i], orderAmountCents: 20000, ttlSeconds: 600 })).status).toBe(
        201,
      );
    }
    // The sweeps have not run: past its validity or its hold, each is still stored as it was.
    const past = new Date(Date.now() - 60_000);
    await t.db.query(`UPDATE user_coupon SET expires_at = ? WHERE id IN (?)`, [
      past,
      [unsweptExpired.id, heldPastValidity.id, timedOutPastValidity.id],
    ]);
    await t.db.query(`UPDATE user_coupon SET locked_until = ? WHERE id IN (?)`, [past, [timedOut.id, timedOutPastValidity.id]]);
    await t.db.query(`UPDATE redemption_hold SET expires_at = ? WHERE user_coupon_id IN (?)`, [
      past,
      [timedOut.id, timedOutPastValidity.id],
    ]);
    // Only a hand edit leaves a LOCKED coupon without the end of its hold: it stays LOCKED.
    await t.db.query(`UPDATE user_coupon SET locked_until = NULL WHERE id = ?`, [heldWithoutEnd.id]);
    const seen = await Promise.all(ucs.map(async (uc) => (await mine('counted', uc.id)).status));
    expect(seen).toEqual(['UNUSED', 'EXPIRED', 'USED', 'VOID', 'LOCKED', 'LOCKED', 'UNUSED', 'EXPIRED', 'LOCKED']);
    const expected = { issued: 9, issuedFromStock: 9, unused: 2, locked: 3, used: 1, expired: 2, void: 1 };
    expect(await counts(coupon.id)).toEqual(expected);
    // The same under ONLY_FULL_GROUP_BY, which a server may have in its sql_mode.
    const strict = t.db.createQueryRunner();
    try {
      await strict.query(`SET SESSION sql_mode = CONCAT(@@sql_mode, ',ONLY_FULL_GROUP_BY')`);
      expect((await countByStatus(strict, [coupon.id])).get(coupon.id)).toEqual(expected);
    } finally {
      await strict.release();
    }
    await t.db.query(
      `UPDATE user_coupon uc JOIN redemption_hold h ON h.user_coupon_id = uc.id AND h.status = 'ACTIVE' SET uc.locked_until = h.expires_at WHERE uc.id = ?`,
      [heldWithoutEnd.id],
    );
  });

  it('validity ending during a hold: a confirmation in time succeeds; a release or a timeout then leaves it EXPIRED', async () => {
    const paid = await userCoupon('ivy');
    const cancelled = await userCoupon('ivy');
    const abandoned = await userCoupon('ivy');
    const orders = [order(), order(), order()];
    await hold(tokenFor('ivy'), { userCouponId: paid.id, orderNo: orders[0], orderAmountCents: 20000, ttlSeconds: 60 });
    await hold(tokenFor('ivy'), { userCouponId: cancelled.id, orderNo: orders[1], orderAmountCents: 20000, ttlSeconds: 60 });
    await hold(tokenFor('ivy'), { userCouponId: abandoned.id, orderNo: orders[2], orderAmountCents: 20000, ttlSeconds: 1 });
    // The coupons' validity ends while they are held.
    await t.db.query(`UPDATE user_coupon SET expires_at = ? WHERE id IN (?)`, [
      new Date(Date.now() - 1000),
      [paid.id, cancelled.id, abandoned.id],
    ]);
    expect((await mine('ivy', paid.id)).status).toBe('LOCKED');
    const ok = await redeem(tokenFor('ivy'), { userCouponId: paid.id, orderNo: orders[0], orderAmountCents: 20000 });
    expect([ok.status, ok.body.status]).toEqual([201, 'USED']);
    const rel = await release(tokenFor('ivy'), { userCouponId: cancelled.id, orderNo: orders[1] });
    expect(rel.status).toBe(200);
    expect(await stored(cancelled.id)).toBe('EXPIRED');
    expect(await steps(cancelled.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>EXPIRED']);
    await sleep(1100);
    expect((await mine('ivy', abandoned.id)).status).toBe('EXPIRED');
    expect(await counts(abandoned.couponId)).toMatchObject({ expired: 1, locked: 0 });
    await sweep();
    expect(await stored(abandoned.id)).toBe('EXPIRED');
    expect(await steps(abandoned.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED', 'LOCKED>EXPIRED']);
  });

  it('a hold for a coupon already redeemed on the same order is 409 COUPON_ALREADY_USED, saying used, not "on another order"', async () => {
    const uc = await userCoupon('ulla');
    const orderNo = order();
    expect((await redeem(tokenFor('ulla'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 })).status).toBe(201);
    const res = await hold(tokenFor('ulla'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
    expect([res.status, res.body.code, res.body.message]).toEqual([409, 'COUPON_ALREADY_USED', 'This coupon was used already']);
  });

  it('refuses bad input with 400 naming the fields and changes nothing', async () => {
    const uc = await userCoupon('jack');
    const fingerprint = await databaseFingerprint(t.db);
    const ok = { userCouponId: uc.id, orderNo: order(), orderAmountCents: 20000 };
    for (const [body, field] of [
      [{ ...ok, extra: 1 }, 'extra'],
      [{ ...ok, ttlSeconds: 0 }, 'ttlSeconds'],
      [{ ...ok, ttlSeconds: 86401 }, 'ttlSeconds'],
      [{ ...ok, ttlSeconds: 1.5 }, 'ttlSeconds'],
      [{ ...ok, ttlSeconds: null }, 'ttlSeconds'],
      [{ ...ok, orderAmountCents: -1 }, 'orderAmountCents'],
      [{ userCouponId: uc.id, orderNo: ok.orderNo }, 'orderAmountCents'],
      [{ ...ok, userCouponId: 'abc' }, 'userCouponId'],
      [{ ...ok, userCouponId: '01' }, 'userCouponId'],
      [{ ...ok, orderNo: '' }, 'orderNo'],
      [{ ...ok, userId: 'bad id!' }, 'userId'],
    ] as const) {
      const res = await hold(tokenFor('jack'), body);
      expect([JSON.stringify(body), res.status, res.body.code]).toEqual([JSON.stringify(body), 400, 'VALIDATION_FAILED']);
      expect(Object.keys(res.body.details.fields)).toContain(field);
    }
    for (const [body, field] of [
      [{ userCouponId: uc.id, orderNo: ok.orderNo, orderAmountCents: 1 }, 'orderAmountCents'],
      [{ userCouponId: 'x', orderNo: ok.orderNo }, 'userCouponId'],
      [{ userCouponId: uc.id }, 'orderNo'],
    ] as const) {
      const res = await release(tokenFor('jack'), body);
      expect([res.status, res.body.code]).toEqual([400, 'VALIDATION_FAILED']);
      expect(Object.keys(res.body.details.fields)).toContain(field);
    }
    const noUser = await hold(serviceToken(), ok);
    expect([noUser.status, noUser.body.details.fields.userId]).toEqual([400, expect.any(Array)]);
    const naming = await hold(tokenFor('jack'), { ...ok, userId: 'someone' });
    expect([naming.status, naming.body.code]).toEqual([403, 'FORBIDDEN']);
    const anon = await request(t.url).post('/redemptions/holds').send(ok);
    expect(anon.status).toBe(401);
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
  });

  it('20 orders racing to hold one coupon: exactly one wins, the others 409 COUPON_LOCKED', async () => {
    for (let round = 0; round < 3; round++) {
      const uc = await userCoupon(`racer-${round}`);
      const answers = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          hold(i % 2 ? serviceToken() : tokenFor(`racer-${round}`), {
            userCouponId: uc.id,
            orderNo: `RACE-${round}-${i}-${seq}`,
            orderAmountCents: 20000,
            userId: `racer-${round}`,
          }),
        ),
      );
      expect(answers.filter((r) => r.status === 201)).toHaveLength(1);
      expect(answers.filter((r) => r.status === 409 && r.body.code === 'COUPON_LOCKED')).toHaveLength(19);
      expect(
        Number(((await t.db.query(`SELECT COUNT(*) AS n FROM redemption_hold WHERE user_coupon_id = ?`, [uc.id])) as { n: string }[])[0].n),
      ).toBe(1);
      expect(await steps(uc.id)).toEqual(['null>UNUSED', 'UNUSED>LOCKED']);
    }
  });

  it('confirm racing release for one hold, 20 rounds: exactly one wins and the coupon ends in the matching state', async () => {
    const outcomes = { confirmed: 0, released: 0 };
    for (let round = 0; round < 20; round++) {
      const uc = await userCoupon('racing');
      const orderNo = order();
      await hold(tokenFor('racing'), { userCouponId: uc.id, orderNo, orderAmountCents: 20000 });
      const [c, r] = await Promise.all([
        redeem(serviceToken(), { userCouponId: uc.id, orderNo, orderAmountCents: 20000, userId: 'racing' }),
        release(serviceToken(), { userCouponId: uc.id, orderNo, userId: 'racing' }),
      ]);
      if (c.status === 201) {
        outcomes.confirmed++;
        expect([r.status, r.body.code]).toEqual([409, 'HOLD_ALREADY_CONFIRMED']);
        expect(await stored(uc.id)).toBe('USED');
        expect(await holdRow(orderNo, uc.id)).toEqual({ status: 'CONFIRMED', release_reason: null });
      } else {
        outcomes.released++;
        expect([c.status, c.body.code, r.status]).toEqual([409, 'HOLD_RELEASED', 200]);
        expect(await stored(uc.id)).toBe('UNUSED');
        expect(await holdRow(orderNo, uc.id)).toEqual({ status: 'RELEASED', release_reason: 'CANCELLED' });
      }
    }
    expect(outcomes.confirmed + outcomes.released).toBe(20);
  });

  it('the sweep never waits for a coupon a release or refund holds, whatever index its hold query takes', async () => {
    const n = 120;
    const coupon = await createCoupon(t.url, { totalStock: n, perUserLimit: n });
    const ucs: string[] = [];
    for (let i = 0; i < n; i++) ucs.push((await grabUserCoupon(t.url, coupon.id, 'swept')).id);
    const orders = ucs.map(() => order());
    for (let i = 0; i < n; i += 20)
      await Promise.all(
        ucs
          .slice(i, i + 20)
          .map((id, j) => hold(tokenFor('swept'), { userCouponId: id, orderNo: orders[i + j], orderAmountCents: 20000, ttlSeconds: 1 })),
      );
    await sleep(1100);
    // A release (or a refund releasing the order's holds) of the last one, in progress: its coupon, then its hold, locked.
    const busy = t.db.createQueryRunner();
    await busy.connect();
    // READ COMMITTED, as every transaction of the service is.
    await busy.startTransaction('READ COMMITTED');
    try {
      await busy.query(`SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`, [ucs[n - 1]]);
      await busy.query(`SELECT id FROM redemption_hold WHERE user_coupon_id = ? AND status = 'ACTIVE' FOR UPDATE`, [ucs[n - 1]]);
      // With the hold query on idx_hold_status (the plan MariaDB picks for a long list of coupons) the sweep
      // read the held coupon's hold too and waited for it, while holding the other coupons a refund goes on to lock.
      const swept = t.app
        .get(TransactionService)
        .inTransaction((em) => t.app.get(HoldSweepService).releaseBatch(em, new Date(), 1000, 'test-sweep'));
      const outcome = await Promise.race([swept, sleep(3000).then(() => 'waited')]);
      expect(outcome).toEqual({ locked: expect.any(Number), released: expect.any(Number) });
      expect((await Promise.all(ucs.map(stored))).filter((s) => s === 'LOCKED')).toEqual(['LOCKED']);
    } finally {
      await busy.rollbackTransaction();
      await busy.release();
    }
    await sweep();
    expect(await stored(ucs[n - 1])).toBe('UNUSED');
  });

  it('the sweep racing confirmations at the timeout: each coupon ends USED exactly when its confirmation answered 201', async () => {
    const n = 40;
    const coupon = await createCoupon(t.url, { totalStock: n, perUserLimit: n });
    const ucs = await Promise.all(
      Array.from({ length: n }, async () => {
        const res = await request(t.url)
          .post(`/coupons/${coupon.id}/grab`)
          .set(bearer(tokenFor('sweepy')))
          .set('Idempotency-Key', newKey());
        return { id: res.body.id as string };
      }),
    );
    const orders = ucs.map(() => order());
    const held = await Promise.all(
      ucs.map((uc, i) => hold(tokenFor('sweepy'), { userCouponId: uc.id, orderNo: orders[i], orderAmountCents: 20000, ttlSeconds: 2 })),
    );
    // Confirmation i is sent at its hold's expiresAt + (i/n - 1/2) * 400 ms, while the sweep runs over and over.
    const expiries = held.map((h) => Date.parse(h.body.expiresAt));
    const sweepUntil = Math.max(...expiries) + 400;
    const sweeping = (async () => {
      await sleep(Math.min(...expiries) - 300 - Date.now());
      while (Date.now() < sweepUntil) await sweep();
    })();
    const answers = await Promise.all(
      ucs.map(async (uc, i) => {
        await sleep(expiries[i] + (i / n - 0.5) * 400 - Date.now());
        return redeem(tokenFor('sweepy'), { userCouponId: uc.id, orderNo: orders[i], orderAmountCents: 20000 });
      }),
    );
    await sweeping;
    await sweep();
    for (let i = 0; i < n; i++) {
      const a = answers[i];
      expect([201, 409]).toContain(a.status);
      if (a.status === 409) expect(a.body.code).toBe('HOLD_EXPIRED');
      expect(await stored(ucs[i].id)).toBe(a.status === 201 ? 'USED' : 'UNUSED');
    }
    console.log(
      `sweep vs confirmations: ${answers.filter((a) => a.status === 201).length} confirmed, ${answers.filter((a) => a.status === 409).length} expired`,
    );
  }, 180_000);
});

/** `n` coupons of a fresh template grabbed by `userId`, each held for 1 s on an order of its own; their ids, and a count of those still ACTIVE. */
async function shortHolds(t: TestApp, userId: string, n: number): Promise<{ ids: string[]; active: () => Promise<number> }> {
  const coupon = await createCoupon(t.url, { totalStock: n, perUserLimit: n });
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const grabbed = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor(userId)))
      .set('Idempotency-Key', newKey());
    const held = await request(t.url)
      .post('/redemptions/holds')
      .set(bearer(tokenFor(userId)))
      .send({ userCouponId: grabbed.body.id, orderNo: `${userId}-order-${i}`, orderAmountCents: 20000, ttlSeconds: 1 });
    expect([grabbed.status, held.status]).toEqual([201, 201]);
    ids.push(grabbed.body.id as string);
  }
  const active = async () =>
    Number(
      (
        (await t.db.query(`SELECT COUNT(*) AS n FROM redemption_hold WHERE user_coupon_id IN (?) AND status = 'ACTIVE'`, [ids])) as {
          n: string;
        }[]
      )[0].n,
    );
  return { ids, active };
}

describe('hold sweep cron', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ SCHEDULER_ENABLED: 'true', HOLD_SWEEP_SECONDS: '1' });
  });
  afterAll(() => t?.close());

  it('HOLD_SWEEP_SECONDS becomes a cron step that fires at least that often, for every allowed value', () => {
    expect([1, 10, 45, 59, 60, 90, 600, 3599, 3600].map(everySeconds)).toEqual([
      '*/1 * * * * *',
      '*/10 * * * * *',
      '*/45 * * * * *',
      '*/59 * * * * *',
      '0 */1 * * * *',
      '0 */1 * * * *',
      '0 */10 * * * *',
      '0 */59 * * * *',
      '0 0 * * * *',
    ]);
    for (const seconds of [1, 7, 45, 59, 60, 61, 119, 3599, 3600]) {
      const job = CronJob.from({ cronTime: everySeconds(seconds), onTick: () => undefined, start: false });
      const times = job.nextDates(200).map((d) => d.toMillis());
      const gaps = times.slice(1).map((at, i) => (at - times[i]) / 1000);
      expect([seconds, Math.max(...gaps) <= seconds]).toEqual([seconds, true]);
    }
    expect(() => everySeconds(0)).toThrow(RangeError);
    expect(() => everySeconds(3601)).toThrow(RangeError);
  });

  it('is registered from HOLD_SWEEP_SECONDS and releases timed-out holds on its own', async () => {
    expect(t.app.get(SchedulerRegistry).getCronJob(HOLD_SWEEP_JOB).cronTime.source).toBe('*/1 * * * * *');
    const { ids, active: left } = await shortHolds(t, 'cron-user', 5);
    const deadline = Date.now() + 10_000;
    while ((await left()) > 0 && Date.now() < deadline) await sleep(200);
    expect(await left()).toBe(0);
    const rows = (await t.db.query(
      `SELECT h.release_reason, uc.status FROM redemption_hold h JOIN user_coupon uc ON uc.id = h.user_coupon_id WHERE uc.id IN (?)`,
      [ids],
    )) as { release_reason: string; status: string }[];
    expect(rows.map((r) => `${r.release_reason}/${r.status}`)).toEqual(ids.map(() => 'TIMEOUT/UNUSED'));
    expect(await checkInvariants(t.db)).toEqual([]);
  });
});

describe('hold sweep batches and lease', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ EXPIRE_BATCH_SIZE: '10' });
  });
  afterAll(() => t?.close());

  it('releases in batches of EXPIRE_BATCH_SIZE, one instance at a time (skipped while another holds the lease), and stops when told', async () => {
    const { active } = await shortHolds(t, 'batchy', 25);
    await sleep(1100);
    const sweeps = t.app.get(HoldSweepService);
    // t.db is a pool of its own, as another instance's would be.
    const other = await tryAcquireLease(t.db, HOLD_SWEEP_LEASE, { ttlMs: 60_000, retries: 2 });
    expect(other).not.toBeNull();
    try {
      expect(await sweeps.runExclusive()).toBeNull();
      expect(await active()).toBe(25);
    } finally {
      await other?.release();
    }
    expect(await sweeps.runExclusive(undefined, AbortSignal.abort())).toEqual({ released: 0, batches: 0, complete: false });
    expect(await active()).toBe(25);
    expect(await sweeps.runExclusive()).toEqual({ released: 25, batches: 3, complete: true });
    expect(await active()).toBe(0);
    expect(await checkInvariants(t.db)).toEqual([]);
  });
});
