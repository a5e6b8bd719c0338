import request from 'supertest';
import { CouponInput, newUserCoupon } from './support/factories.js';
import { bearer, burstAgent, serviceToken, startTestApp, TestApp } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { lockOrder } from '../src/redemption/order.js';
import { databaseFingerprint } from './support/fingerprint.js';

describe('order rules (issue 23 item 2)', () => {
  let t: TestApp;
  let seq = 0;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterEach(async () => {
    expect(await checkInvariants(t.db)).toEqual([]);
  });
  afterAll(() => t.close());

  const order = () => `OR-${process.pid}-${++seq}`;
  const userCoupon = async (userId: string, overrides: CouponInput = {}) => (await newUserCoupon(t.url, userId, overrides)).id;
  const post = (path: string, body: Record<string, unknown>) => request(t.url).post(path).set(bearer(serviceToken())).send(body);
  const redeem = (body: Record<string, unknown>) => post('/redemptions', body);
  const hold = (body: Record<string, unknown>) => post('/redemptions/holds', body);
  const off = (discount: number, stackable = false, threshold = 0): CouponInput & { stackable: boolean } => ({
    discount: { thresholdCents: threshold, amountCents: discount },
    stackable,
  });
  const orderDiscounts = async (orderNo: string) =>
    Number(
      (
        (await t.db.query(`SELECT COALESCE(SUM(discount_cents), 0) AS n FROM redemption WHERE order_no = ? AND status = 'USED'`, [
          orderNo,
        ])) as { n: string }[]
      )[0].n,
    );

  it('one coupon per order: a second coupon, held or redeemed, is 409 ORDER_HAS_COUPON and writes nothing; a released hold frees the order', async () => {
    const [a, b] = [await userCoupon('u1', off(1000)), await userCoupon('u1', off(1000))];
    const orderNo = order();
    expect((await hold({ userCouponId: a, orderNo, orderAmountCents: 5000, userId: 'u1' })).status).toBe(201);
    const fingerprint = await databaseFingerprint(t.db);
    for (const attempt of [hold, redeem]) {
      const res = await attempt({ userCouponId: b, orderNo, orderAmountCents: 5000, userId: 'u1' });
      expect([res.status, res.body.code, res.body.details]).toEqual([409, 'ORDER_HAS_COUPON', { userCouponIds: [a] }]);
    }
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    expect((await post('/redemptions/holds/release', { userCouponId: a, orderNo, userId: 'u1' })).status).toBe(200);
    expect((await redeem({ userCouponId: b, orderNo, orderAmountCents: 5000, userId: 'u1' })).status).toBe(201);
    const again = await redeem({ userCouponId: a, orderNo, orderAmountCents: 5000, userId: 'u1' });
    expect([again.status, again.body.code]).toEqual([409, 'HOLD_RELEASED']);
    const third = await redeem({ userCouponId: await userCoupon('u1', off(1000)), orderNo, orderAmountCents: 5000, userId: 'u1' });
    expect([third.status, third.body.code]).toEqual([409, 'ORDER_HAS_COUPON']);
  });

  it('stackable coupons share an order, their discounts cut to its amount; a non-stackable one joins none', async () => {
    const orderNo = order();
    const [s1, s2, s3] = [
      await userCoupon('u2', off(1000, true)),
      await userCoupon('u2', off(1000, true)),
      await userCoupon('u2', off(1000, true)),
    ];
    const plain = await userCoupon('u2', off(100));
    const first = await redeem({ userCouponId: s1, orderNo, orderAmountCents: 1500, userId: 'u2' });
    expect([first.status, first.body.discountCents]).toEqual([201, 1000]);
    const notStackable = await hold({ userCouponId: plain, orderNo, orderAmountCents: 1500, userId: 'u2' });
    expect([notStackable.status, notStackable.body.code]).toEqual([409, 'ORDER_HAS_COUPON']);
    const second = await hold({ userCouponId: s2, orderNo, orderAmountCents: 1500, userId: 'u2' });
    expect([second.status, second.body.discountCents]).toEqual([201, 500]);
    const full = await redeem({ userCouponId: s3, orderNo, orderAmountCents: 1500, userId: 'u2' });
    expect([full.status, full.body.code]).toEqual([409, 'ORDER_HAS_COUPON']);
    const confirmed = await redeem({ userCouponId: s2, orderNo, orderAmountCents: 1500, userId: 'u2' });
    expect([confirmed.status, confirmed.body.discountCents]).toEqual([201, 500]);
    expect(await orderDiscounts(orderNo)).toBe(1500);
    // A stackable coupon does not join an order that carries a non-stackable one either.
    const other = order();
    expect((await redeem({ userCouponId: plain, orderNo: other, orderAmountCents: 9000, userId: 'u2' })).status).toBe(201);
    const onPlain = await redeem({ userCouponId: s3, orderNo: other, orderAmountCents: 9000, userId: 'u2' });
    expect([onPlain.status, onPlain.body.code]).toEqual([409, 'ORDER_HAS_COUPON']);
  });

  it('every hold and redemption of an order names one amount: else 422 ORDER_AMOUNT_MISMATCH', async () => {
    const orderNo = order();
    const [a, b] = [await userCoupon('u3', off(100, true)), await userCoupon('u3', off(100, true))];
    expect((await hold({ userCouponId: a, orderNo, orderAmountCents: 2000, userId: 'u3' })).status).toBe(201);
    const fingerprint = await databaseFingerprint(t.db);
    for (const attempt of [hold, redeem]) {
      const res = await attempt({ userCouponId: b, orderNo, orderAmountCents: 2500, userId: 'u3' });
      expect([res.status, res.body.code, res.body.details]).toEqual([422, 'ORDER_AMOUNT_MISMATCH', { orderAmountCents: 2000 }]);
    }
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    expect((await redeem({ userCouponId: b, orderNo, orderAmountCents: 2000, userId: 'u3' })).status).toBe(201);
  });

  it('an order with nothing on it any more takes a new amount: its cart changed after a released or timed-out hold', async () => {
    for (const stackable of [false, true]) {
      const orderNo = order();
      const [a, b, c] = [
        await userCoupon('u5', off(100, stackable)),
        await userCoupon('u5', off(100, stackable)),
        await userCoupon('u5', off(100, stackable)),
      ];
      expect((await hold({ userCouponId: a, orderNo, orderAmountCents: 1000, userId: 'u5' })).status).toBe(201);
      expect((await post('/redemptions/holds/release', { userCouponId: a, orderNo, userId: 'u5' })).status).toBe(200);
      const held = await hold({ userCouponId: b, orderNo, orderAmountCents: 1500, userId: 'u5', ttlSeconds: 3 });
      expect(held.status).toBe(201);
      // While b is held, the order is priced at 1500: another amount is refused (one coupon, or stacked at one amount).
      const whileHeld = await redeem({ userCouponId: c, orderNo, orderAmountCents: 1200, userId: 'u5' });
      expect([whileHeld.status, whileHeld.body.code]).toEqual(stackable ? [422, 'ORDER_AMOUNT_MISMATCH'] : [409, 'ORDER_HAS_COUPON']);
      await new Promise((r) => setTimeout(r, Date.parse(held.body.expiresAt) + 100 - Date.now()));
      const afterTimeout = await redeem({ userCouponId: c, orderNo, orderAmountCents: 2000, userId: 'u5' });
      expect([afterTimeout.status, afterTimeout.body.discountCents]).toEqual([201, 100]);
      const priced = (await t.db.query(`SELECT order_amount_cents AS a FROM coupon_order WHERE order_no = ?`, [orderNo])) as {
        a: string;
      }[];
      expect(Number(priced[0].a)).toBe(2000);
    }
  });

  it('a refunded order takes no new hold or redemption (409 ORDER_REFUNDED): the replacement cannot be redeemed on it again and again', async () => {
    const orderNo = order();
    const first = await userCoupon('u4', { ...off(500), returnOnRefund: true });
    expect((await redeem({ userCouponId: first, orderNo, orderAmountCents: 600, userId: 'u4' })).status).toBe(201);
    const refund = await post('/redemptions/refunds', { userCouponId: first, orderNo, refundNo: `RF-${orderNo}` });
    expect(refund.status).toBe(201);
    const replacement = refund.body.replacementUserCoupon.id as string;
    const fingerprint = await databaseFingerprint(t.db);
    for (let i = 0; i < 3; i++) {
      for (const attempt of [redeem, hold]) {
        const res = await attempt({ userCouponId: replacement, orderNo, orderAmountCents: 600, userId: 'u4' });
        expect([res.status, res.body.code]).toEqual([409, 'ORDER_REFUNDED']);
      }
    }
    expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    expect(await orderDiscounts(orderNo)).toBe(500);
    // Its row lost (reconciliation reports ORDER_ROW_MISSING): still refunded, as its refund says, not a new order.
    await t.db.query(`DELETE FROM coupon_order WHERE order_no = ?`, [orderNo]);
    const lost = await databaseFingerprint(t.db);
    for (const attempt of [redeem, hold]) {
      const res = await attempt({ userCouponId: replacement, orderNo, orderAmountCents: 600, userId: 'u4' });
      expect([res.status, res.body.code]).toEqual([409, 'ORDER_REFUNDED']);
    }
    expect(await databaseFingerprint(t.db)).toEqual(lost);
    // The replacement works on another order; a replay of the refunded order's redemption still answers.
    expect((await redeem({ userCouponId: replacement, orderNo: order(), orderAmountCents: 600, userId: 'u4' })).status).toBe(201);
    const replay = await redeem({ userCouponId: first, orderNo, orderAmountCents: 600, userId: 'u4' });
    expect([replay.status, replay.body.firstUse]).toEqual([200, false]);
  });

  it("the refund of a coupon releases the order's other holds: they cannot be confirmed, and their coupons are free at once", async () => {
    const orderNo = order();
    const [a, b] = [await userCoupon('u5', { ...off(100, true), returnOnRefund: true }), await userCoupon('u5', off(100, true))];
    expect((await redeem({ userCouponId: a, orderNo, orderAmountCents: 1000, userId: 'u5' })).status).toBe(201);
    expect((await hold({ userCouponId: b, orderNo, orderAmountCents: 1000, userId: 'u5', ttlSeconds: 86400 })).status).toBe(201);
    expect((await post('/redemptions/refunds', { userCouponId: a, orderNo, refundNo: `RF-${orderNo}` })).status).toBe(201);
    const confirm = await redeem({ userCouponId: b, orderNo, orderAmountCents: 1000, userId: 'u5' });
    expect([confirm.status, confirm.body.code]).toEqual([409, 'HOLD_RELEASED']);
    const released = await post('/redemptions/holds/release', { userCouponId: b, orderNo, userId: 'u5' });
    expect([released.status, released.headers['idempotent-replayed'], released.body.status, released.body.releaseReason]).toEqual([
      200,
      'true',
      'RELEASED',
      'CANCELLED',
    ]);
    const [{ status }] = (await t.db.query('SELECT status FROM user_coupon WHERE id = ?', [b])) as { status: string }[];
    expect(status).toBe('UNUSED');
    expect((await redeem({ userCouponId: b, orderNo: order(), orderAmountCents: 1000, userId: 'u5' })).status).toBe(201);
  });

  it("a refund goes through when another hold on its order has a coupon that is not LOCKED (a gap left for reconciliation); the release's log names the refund", async () => {
    const orderNo = order();
    const [a, b, c] = [
      await userCoupon('u6', { ...off(100, true), returnOnRefund: true }),
      await userCoupon('u6', off(100, true)),
      await userCoupon('u6', off(100, true)),
    ];
    expect((await redeem({ userCouponId: a, orderNo, orderAmountCents: 1000, userId: 'u6' })).status).toBe(201);
    for (const held of [b, c]) expect((await hold({ userCouponId: held, orderNo, orderAmountCents: 1000, userId: 'u6' })).status).toBe(201);
    // A hand edit behind the service's back: c's hold is ACTIVE, its coupon no longer LOCKED.
    await t.db.query(`UPDATE user_coupon SET status = 'UNUSED' WHERE id = ?`, [c]);
    const refundNo = `RF-${orderNo}`;
    const refund = await post('/redemptions/refunds', { userCouponId: a, orderNo, refundNo });
    expect(refund.status).toBe(201);
    const holds = (await t.db.query(`SELECT user_coupon_id, status FROM redemption_hold WHERE order_no = ? ORDER BY id`, [orderNo])) as {
      user_coupon_id: string;
      status: string;
    }[];
    expect(holds.map((h) => [String(h.user_coupon_id), h.status])).toEqual([
      [b, 'RELEASED'],
      [c, 'ACTIVE'],
    ]);
    const [log] = (await t.db.query(`SELECT reason FROM user_coupon_state_log WHERE user_coupon_id = ? ORDER BY id DESC LIMIT 1`, [b])) as {
      reason: string;
    }[];
    expect(log.reason).toBe(`hold released: CANCELLED (order refunded: refund ${refundNo})`);
    // Put back as it was, so that the invariants hold again: c LOCKED, then released by its user.
    await t.db.query(`UPDATE user_coupon SET status = 'LOCKED' WHERE id = ?`, [c]);
    expect((await post('/redemptions/holds/release', { userCouponId: c, orderNo, userId: 'u6' })).status).toBe(200);
  });

  it("a refusal names no other customer's coupons or order amount: ORDER_HAS_COUPON and ORDER_AMOUNT_MISMATCH show only the caller's own", async () => {
    const orderNo = order();
    const mine = await userCoupon('owner', off(100, true));
    expect((await hold({ userCouponId: mine, orderNo, orderAmountCents: 1234, userId: 'owner' })).status).toBe(201);
    const [stackable, plain] = [await userCoupon('squatter', off(100, true)), await userCoupon('squatter', off(100))];
    const priced = await hold({ userCouponId: stackable, orderNo, orderAmountCents: 999, userId: 'squatter' });
    expect([priced.status, priced.body.code, priced.body.details ?? null]).toEqual([422, 'ORDER_AMOUNT_MISMATCH', null]);
    expect(priced.body.message).not.toContain('1234');
    const taken = await redeem({ userCouponId: plain, orderNo, orderAmountCents: 1234, userId: 'squatter' });
    expect([taken.status, taken.body.code, taken.body.details]).toEqual([409, 'ORDER_HAS_COUPON', { userCouponIds: [] }]);
    // The owner is told what is on the order.
    const own = await redeem({ userCouponId: await userCoupon('owner', off(100, true)), orderNo, orderAmountCents: 999, userId: 'owner' });
    expect([own.status, own.body.code, own.body.details]).toEqual([422, 'ORDER_AMOUNT_MISMATCH', { orderAmountCents: 1234 }]);
    expect((await post('/redemptions/holds/release', { userCouponId: mine, orderNo, userId: 'owner' })).status).toBe(200);
  });

  it('two coupons racing onto one order, 20 rounds: exactly one wins, the other 409 ORDER_HAS_COUPON', async () => {
    for (let round = 0; round < 20; round++) {
      const user = `racer-${round}`;
      const [a, b] = [await userCoupon(user, off(1000)), await userCoupon(user, off(1000))];
      const orderNo = order();
      const attempts = round % 2 ? [hold, redeem] : [redeem, redeem];
      const answers = await Promise.all(
        [a, b].map((uc, i) => attempts[i]({ userCouponId: uc, orderNo, orderAmountCents: 5000, userId: user })),
      );
      expect(answers.map((r) => r.status).sort()).toEqual([201, 409]);
      expect(answers.find((r) => r.status === 409)!.body.code).toBe('ORDER_HAS_COUPON');
    }
  });

  it('90 requests onto a new order whose row is created by a refused one: never a 5xx, exactly one coupon wins, 30 rounds', async () => {
    // The request that inserts an order's row may be refused and roll it back while the others
    // queue on that row; they must then be decided one after the other. Kept-alive sockets put all
    // 90 in flight at once (a new connection each spreads them out and hides the race).
    const user = 'crowd';
    for (let round = 0; round < 30; round++) {
      const orderNo = order();
      const winner = await userCoupon(user, off(1000));
      const answers = await Promise.all(
        Array.from({ length: 90 }, (_, i) =>
          post(i % 2 ? '/redemptions/holds' : '/redemptions', {
            // All but one name a coupon that is not the user's: refused after the order's lock.
            userCouponId: i === 45 ? winner : '999999999',
            orderNo,
            orderAmountCents: 5000,
            userId: user,
          }).agent(burstAgent),
        ),
      );
      expect(answers.filter((r) => r.status >= 500).map((r) => [r.status, r.body.code])).toEqual([]);
      expect(answers.filter((r) => r.status === 201).map((r) => r.body.userCouponId)).toEqual([winner]);
      expect(answers.filter((r) => r.status !== 201).every((r) => r.body.code === 'USER_COUPON_NOT_FOUND')).toBe(true);
    }
  }, 120_000);

  it("an order's row made elsewhere between the lock and the insert (another cluster node): the lock takes that row, its amount, and writes it", async () => {
    const orderNo = order();
    const found = await t.db.transaction('READ COMMITTED', async (em) => {
      // Stands for another node's insert, replicated after this node's stripe lock saw no row.
      const elsewhere = new Proxy(em, {
        get: (target, prop) =>
          prop === 'query'
            ? async (sql: string, params: unknown[]) => {
                if (sql.startsWith('INSERT INTO coupon_order ')) {
                  await t.db.query(
                    `INSERT INTO coupon_order (order_no, order_amount_cents, refunded, created_at) VALUES (?, 7000, 0, NOW(3))`,
                    [orderNo],
                  );
                }
                return target.query(sql, params);
              }
            : Reflect.get(target, prop),
      });
      return lockOrder(elsewhere, orderNo, 5000, new Date());
    });
    expect(found).toEqual({ orderNo, orderAmountCents: 7000, refunded: false });
    const [row] = (await t.db.query(`SELECT order_amount_cents, lock_version FROM coupon_order WHERE order_no = ?`, [orderNo])) as {
      order_amount_cents: string;
      lock_version: string;
    }[];
    expect([Number(row.order_amount_cents), Number(row.lock_version)]).toEqual([7000, 1]);
  });

  it('ten stackable coupons racing onto one order of 3500: the discounts add up to exactly 3500, never more', async () => {
    const user = 'stacker';
    const ucs = await Promise.all(Array.from({ length: 10 }, () => userCoupon(user, off(1000, true))));
    const orderNo = order();
    const answers = await Promise.all(
      ucs.map((uc, i) => (i % 2 ? hold : redeem)({ userCouponId: uc, orderNo, orderAmountCents: 3500, userId: user })),
    );
    const won = answers.filter((r) => r.status === 201);
    expect(won.map((r) => r.body.discountCents as number).sort((x, y) => y - x)).toEqual([1000, 1000, 1000, 500]);
    expect(answers.filter((r) => r.status === 409).every((r) => r.body.code === 'ORDER_HAS_COUPON')).toBe(true);
    const [{ n }] = (await t.db.query(
      `SELECT SUM(discount_cents) AS n FROM (SELECT discount_cents FROM redemption WHERE order_no = ? UNION ALL SELECT discount_cents FROM redemption_hold WHERE order_no = ? AND status = 'ACTIVE') x`,
      [orderNo, orderNo],
    )) as { n: string }[];
    expect(Number(n)).toBe(3500);
  });
});
