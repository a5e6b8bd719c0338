import request from 'supertest';
import { createCoupon, CouponInput, grabUserCoupon } from './support/factories.js';
import { checkInvariantsAfterEach } from './support/scoped-invariants.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';

const DAY = 86_400_000;

describe('redemption', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  checkInvariantsAfterEach(() => t.db);
  afterAll(() => t.close());

  const count = async (sql: string, params: unknown[] = []) => Number(((await t.db.query(sql, params)) as { n: string }[])[0].n);
  const redemptionsOf = (ucId: string) => count(`SELECT COUNT(*) AS n FROM redemption WHERE user_coupon_id = ?`, [ucId]);
  const usedLogsOf = (ucId: string) =>
    count(`SELECT COUNT(*) AS n FROM user_coupon_state_log WHERE user_coupon_id = ? AND to_status = 'USED'`, [ucId]);

  /** A user coupon of `userId`, grabbed through the API. */
  async function userCoupon(userId: string, overrides: CouponInput = {}): Promise<string> {
    const coupon = await createCoupon(t.url, { totalStock: 10, ...overrides });
    return (await grabUserCoupon(t.url, coupon.id, userId)).id;
  }
  const redeem = (token: string, body: Record<string, unknown>) => request(t.url).post('/redemptions').set(bearer(token)).send(body);

  it('a repeat of (orderNo, userCouponId) with another orderAmountCents is 422 IDEMPOTENCY_KEY_REUSED and changes nothing', async () => {
    const ucId = await userCoupon('twice');
    const body = { userCouponId: ucId, orderNo: 'ORD-AMOUNT', orderAmountCents: 20000 };
    expect((await redeem(tokenFor('twice'), body)).status).toBe(201);
    const other = await redeem(tokenFor('twice'), { ...body, orderAmountCents: 30000 });
    expect([other.status, other.body.code, other.body.details]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED', { orderAmountCents: 20000 }]);
    const viaService = await redeem(serviceToken(), { ...body, orderAmountCents: 19999, userId: 'twice' });
    expect([viaService.status, viaService.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    const same = await redeem(tokenFor('twice'), body);
    expect([same.status, same.body.firstUse, same.headers['idempotent-replayed']]).toEqual([200, false, 'true']);
    expect(await redemptionsOf(ucId)).toBe(1);
    expect(await usedLogsOf(ucId)).toBe(1);
  });

  it('the same (orderNo, userCouponId) sent 50 times concurrently: one redemption, one USED log row, one 201 and 49 200s', async () => {
    const ucId = await userCoupon('payer');
    const body = { userCouponId: ucId, orderNo: 'ORD-50', orderAmountCents: 20000, userId: 'payer' };
    const answers = await Promise.all(Array.from({ length: 50 }, (_, i) => redeem(i % 2 ? serviceToken() : tokenFor('payer'), body)));
    expect(answers.filter((r) => r.status === 201)).toHaveLength(1);
    expect(answers.filter((r) => r.status === 200)).toHaveLength(49);
    expect(answers.filter((r) => r.status === 200).every((r) => r.body.firstUse === false)).toBe(true);
    const replayHeaders = answers.map((r) => `${r.status} ${r.headers['idempotent-replayed']}`);
    expect(replayHeaders.filter((h) => h === '201 undefined')).toHaveLength(1);
    expect(replayHeaders.filter((h) => h === '200 true')).toHaveLength(49);
    const first = answers.find((r) => r.status === 201)!.body;
    expect(first).toMatchObject({
      userCouponId: ucId,
      orderNo: 'ORD-50',
      userId: 'payer',
      discountCents: 1000,
      status: 'USED',
      firstUse: true,
    });
    expect(typeof first.redemptionId).toBe('string');
    for (const r of answers) expect({ ...r.body, firstUse: true }).toEqual(first);
    expect(await redemptionsOf(ucId)).toBe(1);
    expect(await usedLogsOf(ucId)).toBe(1);
    const mine = await request(t.url)
      .get(`/me/coupons/${ucId}`)
      .set(bearer(tokenFor('payer')));
    expect(mine.body).toMatchObject({ status: 'USED', usedAt: first.usedAt });
  });

  it('two orders racing for one coupon, 50 rounds: exactly one wins each round, the loser gets 409 and leaves no row', async () => {
    for (let round = 0; round < 50; round++) {
      const ucId = await userCoupon(`racer-${round}`);
      const answers = await Promise.all(
        ['A', 'B'].map((o) =>
          redeem(serviceToken(), { userCouponId: ucId, orderNo: `R${round}-${o}`, orderAmountCents: 10000, userId: `racer-${round}` }),
        ),
      );
      expect(answers.map((r) => r.status).sort()).toEqual([201, 409]);
      expect(answers.find((r) => r.status === 409)!.body.code).toBe('COUPON_ALREADY_USED');
      expect(await redemptionsOf(ucId)).toBe(1);
      expect(await usedLogsOf(ucId)).toBe(1);
    }
  });

  it("refuses another user's coupon, below threshold, expired, void and not-yet-valid coupons, writing nothing", async () => {
    const owned = await userCoupon('owner');
    const other = await redeem(tokenFor('intruder'), { userCouponId: owned, orderNo: 'X1', orderAmountCents: 50000 });
    expect([other.status, other.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
    const byService = await redeem(serviceToken(), { userCouponId: owned, orderNo: 'X1', orderAmountCents: 50000, userId: 'intruder' });
    expect([byService.status, byService.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
    const missing = await redeem(tokenFor('owner'), { userCouponId: '987654321', orderNo: 'X1', orderAmountCents: 50000 });
    expect([missing.status, missing.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);

    const below = await redeem(tokenFor('owner'), { userCouponId: owned, orderNo: 'X2', orderAmountCents: 9999 });
    expect([below.status, below.body.code]).toEqual([422, 'THRESHOLD_NOT_MET']);

    const expiring = await userCoupon('owner', {
      validity: { type: 'FIXED', startAt: new Date(Date.now() - DAY).toISOString(), endAt: new Date(Date.now() + DAY).toISOString() },
    });
    await t.db.query(`UPDATE user_coupon SET expires_at = ? WHERE id = ?`, [new Date(Date.now() - 1000), expiring]);
    const expired = await redeem(tokenFor('owner'), { userCouponId: expiring, orderNo: 'X3', orderAmountCents: 50000 });
    expect([expired.status, expired.body.code]).toEqual([409, 'COUPON_EXPIRED']);

    const future = await userCoupon('owner', {
      validity: { type: 'FIXED', startAt: new Date(Date.now() + DAY).toISOString(), endAt: new Date(Date.now() + 2 * DAY).toISOString() },
    });
    const early = await redeem(tokenFor('owner'), { userCouponId: future, orderNo: 'X4', orderAmountCents: 50000 });
    expect([early.status, early.body.code]).toEqual([409, 'COUPON_NOT_YET_VALID']);

    const voided = await userCoupon('owner');
    await t.db.transaction(async (em) => {
      await em.query(`UPDATE user_coupon SET status = 'VOID' WHERE id = ?`, [voided]);
      await em.query(
        `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES (?, 'UNUSED', 'VOID', 'test', 'test', NOW(3))`,
        [voided],
      );
    });
    const isVoid = await redeem(tokenFor('owner'), { userCouponId: voided, orderNo: 'X5', orderAmountCents: 50000 });
    expect([isVoid.status, isVoid.body.code]).toEqual([409, 'COUPON_VOID']);

    expect(
      await count(`SELECT COUNT(*) AS n FROM redemption WHERE user_coupon_id IN (?, ?, ?, ?)`, [owned, expiring, future, voided]),
    ).toBe(0);
    expect(await count(`SELECT COUNT(*) AS n FROM user_coupon WHERE id IN (?, ?) AND status <> 'UNUSED'`, [owned, future])).toBe(0);
  });

  it('lets a service redeem for a user, refuses a user naming another user, and requires userId from services', async () => {
    const ucId = await userCoupon('client');
    const naming = await redeem(tokenFor('client'), { userCouponId: ucId, orderNo: 'S1', orderAmountCents: 10000, userId: 'someone' });
    expect([naming.status, naming.body.code]).toEqual([403, 'FORBIDDEN']);
    const noUser = await redeem(serviceToken(), { userCouponId: ucId, orderNo: 'S1', orderAmountCents: 10000 });
    expect([noUser.status, noUser.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    expect(await redemptionsOf(ucId)).toBe(0);
    const ok = await redeem(serviceToken(), { userCouponId: ucId, orderNo: 'S1', orderAmountCents: 10000, userId: 'client' });
    expect([ok.status, ok.body.firstUse, ok.body.discountCents]).toEqual([201, true, 1000]);
    const anon = await request(t.url).post('/redemptions').send({ userCouponId: ucId, orderNo: 'S1', orderAmountCents: 1 });
    expect(anon.status).toBe(401);
  });

  it('rejects malformed bodies with 400 and the offending fields', async () => {
    for (const body of [
      {},
      { userCouponId: 'abc', orderNo: 'B', orderAmountCents: 1 },
      { userCouponId: '1', orderNo: '', orderAmountCents: 1 },
      { userCouponId: '1', orderNo: '   ', orderAmountCents: 1 },
      { userCouponId: '1', orderNo: '\u3000', orderAmountCents: 1 },
      { userCouponId: '1', orderNo: 'x'.repeat(65), orderAmountCents: 1 },
      { userCouponId: '1', orderNo: 'B', orderAmountCents: -1 },
      { userCouponId: '1', orderNo: 'B', orderAmountCents: 1e300 },
      { userCouponId: '1', orderNo: 'B', orderAmountCents: '100' },
      { userCouponId: '1', orderNo: 'B', orderAmountCents: 1, extra: 1 },
      { userCouponId: '1', orderNo: 'B', orderAmountCents: 1, userId: 'bad id!' },
    ]) {
      const res = await redeem(tokenFor('u'), body);
      expect([JSON.stringify(body), res.status, res.body.code]).toEqual([JSON.stringify(body), 400, 'VALIDATION_FAILED']);
    }
    const arr = await request(t.url)
      .post('/redemptions')
      .set(bearer(tokenFor('u')))
      .send([1, 2]);
    expect([arr.status, arr.body.code]).toEqual([400, 'VALIDATION_FAILED']);
  });

  describe('refund', () => {
    const refund = (body: Record<string, unknown>, token = serviceToken()) =>
      request(t.url).post('/redemptions/refunds').set(bearer(token)).send(body);

    it('retried 20 times concurrently issues one replacement; the original stays USED', async () => {
      const ucId = await userCoupon('refunded', { returnOnRefund: true });
      expect((await redeem(tokenFor('refunded'), { userCouponId: ucId, orderNo: 'RF-1', orderAmountCents: 10000 })).status).toBe(201);
      const answers = await Promise.all(
        Array.from({ length: 20 }, () => refund({ userCouponId: ucId, orderNo: 'RF-1', refundNo: 'REF-1' })),
      );
      expect(answers.every((r) => r.status === 201)).toBe(true);
      const replacementIds = new Set(answers.map((r) => r.body.replacementUserCoupon.id));
      expect(replacementIds.size).toBe(1);
      expect(answers.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
      expect(
        await count(`SELECT COUNT(*) AS n FROM user_coupon WHERE replaces_user_coupon_id = ? AND source = 'REFUND_RETURN'`, [ucId]),
      ).toBe(1);
      expect(await count(`SELECT COUNT(*) AS n FROM refund WHERE user_coupon_id = ?`, [ucId])).toBe(1);
      const replacement = answers[0].body.replacementUserCoupon;
      expect(replacement).toMatchObject({ userId: 'refunded', status: 'UNUSED', source: 'REFUND_RETURN' });
      expect(
        (
          await request(t.url)
            .get(`/me/coupons/${ucId}`)
            .set(bearer(tokenFor('refunded')))
        ).body.status,
      ).toBe('USED');
      // A second refundNo for the same redemption returns the same replacement, and the replacement is usable.
      const other = await refund({ userCouponId: ucId, orderNo: 'RF-1', refundNo: 'REF-2' });
      expect(other.body.replacementUserCoupon.id).toBe(replacement.id);
      const reuse = await redeem(tokenFor('refunded'), { userCouponId: replacement.id, orderNo: 'RF-2', orderAmountCents: 10000 });
      expect(reuse.status).toBe(201);
      // A repeat repeats the first answer: the replacement as the refund issued it, though it has been used since.
      const repeat = await refund({ userCouponId: ucId, orderNo: 'RF-1', refundNo: 'REF-1' });
      expect([repeat.status, repeat.headers['idempotent-replayed'], repeat.body]).toEqual([201, 'true', answers[0].body]);
      // Invariant 1 checks out through the API: the replacement is issued, but not from stock.
      const couponId = (replacement as { couponId: string }).couponId;
      const admin = await request(t.url).get(`/admin/coupons/${couponId}`).set(bearer(adminToken()));
      expect([admin.body.initStock, admin.body.remainingStock, admin.body.counts.issued, admin.body.counts.issuedFromStock]).toEqual([
        10, 9, 2, 1,
      ]);
    });

    it('one refundNo sent concurrently for two different coupons: one refund, the other 422, never a 5xx', async () => {
      const [a, b] = [await userCoupon('twin', { returnOnRefund: true }), await userCoupon('twin', { returnOnRefund: true })];
      for (const [uc, order] of [
        [a, 'TW-A'],
        [b, 'TW-B'],
      ])
        expect((await redeem(tokenFor('twin'), { userCouponId: uc, orderNo: order, orderAmountCents: 10000 })).status).toBe(201);
      const answers = await Promise.all([
        refund({ userCouponId: a, orderNo: 'TW-A', refundNo: 'TW-1' }),
        refund({ userCouponId: b, orderNo: 'TW-B', refundNo: 'TW-1' }),
      ]);
      expect(answers.map((r) => r.status).sort()).toEqual([201, 422]);
      expect(answers.find((r) => r.status === 422)!.body.code).toBe('IDEMPOTENCY_KEY_REUSED');
      expect(typeof answers.find((r) => r.status === 201)!.body.refundId).toBe('string');
      expect(await count(`SELECT COUNT(*) AS n FROM refund WHERE refund_no = 'TW-1'`)).toBe(1);
    });

    it('a refundNo answered with an earlier refund of its redemption names that refund for good: it makes no other, racing or not', async () => {
      const ucs = await Promise.all([1, 2, 3, 4].map(() => userCoupon('alias', { returnOnRefund: true })));
      for (const [i, uc] of ucs.entries())
        expect((await redeem(tokenFor('alias'), { userCouponId: uc, orderNo: `AL-${i}`, orderAmountCents: 10000 })).status).toBe(201);
      const first = await refund({ userCouponId: ucs[0], orderNo: 'AL-0', refundNo: 'AL-R1' });
      expect(first.status).toBe(201);
      const alias = await refund({ userCouponId: ucs[0], orderNo: 'AL-0', refundNo: 'AL-R2' });
      expect([alias.status, alias.headers['idempotent-replayed'], alias.body]).toEqual([201, 'true', first.body]);
      // AL-R2 now names the refund of coupon 0: another coupon's refund under it is a reused key.
      const taken = await refund({ userCouponId: ucs[1], orderNo: 'AL-1', refundNo: 'AL-R2' });
      expect([taken.status, taken.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
      expect((await refund({ userCouponId: ucs[0], orderNo: 'AL-0', refundNo: 'AL-R2' })).body).toEqual(first.body);
      expect((await refund({ userCouponId: ucs[1], orderNo: 'AL-1', refundNo: 'AL-R3' })).status).toBe(201);
      // A refund made by an instance older than refund_number (a rolling deploy) has no row there: its number is still taken.
      await t.db.query(`DELETE FROM refund_number WHERE refund_no = 'AL-R3'`);
      const older = await refund({ userCouponId: ucs[0], orderNo: 'AL-0', refundNo: 'AL-R3' });
      expect([older.status, older.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
      const own = await refund({ userCouponId: ucs[1], orderNo: 'AL-1', refundNo: 'AL-R3' });
      expect([own.status, own.headers['idempotent-replayed']]).toEqual([201, 'true']);

      // Racing: the number answered as coupon 2's refund and asked for coupon 3's new one at once.
      expect((await refund({ userCouponId: ucs[2], orderNo: 'AL-2', refundNo: 'AL-R4' })).status).toBe(201);
      const raced = await Promise.all([
        refund({ userCouponId: ucs[2], orderNo: 'AL-2', refundNo: 'AL-R5' }),
        refund({ userCouponId: ucs[3], orderNo: 'AL-3', refundNo: 'AL-R5' }),
      ]);
      expect(raced.map((r) => r.status).sort()).toEqual([201, 422]);
      const named = (await t.db.query(
        `SELECT r.user_coupon_id AS uc FROM refund_number n JOIN refund r ON r.id = n.refund_id WHERE n.refund_no = 'AL-R5'`,
      )) as {
        uc: string;
      }[];
      expect(named).toHaveLength(1);
      const winner = raced.find((r) => r.status === 201)!;
      expect(winner.body.userCouponId).toBe(String(named[0].uc));
    });

    it('treats order and refund numbers as case-sensitive', async () => {
      const ucId = await userCoupon('casey', { returnOnRefund: true });
      expect((await redeem(tokenFor('casey'), { userCouponId: ucId, orderNo: 'ord-case', orderAmountCents: 10000 })).status).toBe(201);
      const other = await redeem(tokenFor('casey'), { userCouponId: ucId, orderNo: 'ORD-CASE', orderAmountCents: 10000 });
      expect([other.status, other.body.code]).toEqual([409, 'COUPON_ALREADY_USED']);
      expect((await refund({ userCouponId: ucId, orderNo: 'ord-case', refundNo: 'rf-case' })).status).toBe(201);
      const upper = await refund({ userCouponId: ucId, orderNo: 'ORD-CASE', refundNo: 'RF-CASE' });
      expect([upper.status, upper.body.code]).toEqual([409, 'NOT_REDEEMED']);
    });

    it('treats order and refund numbers that differ only in trailing spaces as different numbers', async () => {
      const [first, second] = [await userCoupon('spacey', { returnOnRefund: true }), await userCoupon('spacey', { returnOnRefund: true })];
      const order = (userCouponId: string, orderNo: string) =>
        redeem(tokenFor('spacey'), { userCouponId, orderNo, orderAmountCents: 10000 });
      expect((await order(first, 'ORD-SP')).status).toBe(201);
      // The used coupon on another order, and another coupon on that other order (one coupon per order).
      const again = await order(first, 'ORD-SP ');
      expect([again.status, again.body.code]).toEqual([409, 'COUPON_ALREADY_USED']);
      const padded = await order(second, 'ORD-SP ');
      expect([padded.status, padded.body.orderNo]).toEqual([201, 'ORD-SP ']);
      const refunded = await refund({ userCouponId: first, orderNo: 'ORD-SP', refundNo: 'RF-SP' });
      expect(refunded.status).toBe(201);
      const own = await refund({ userCouponId: second, orderNo: 'ORD-SP ', refundNo: 'RF-SP ' });
      expect([own.status, own.headers['idempotent-replayed'], own.body.userCouponId, own.body.orderNo]).toEqual([
        201,
        undefined,
        second,
        'ORD-SP ',
      ]);
      const notThere = await refund({ userCouponId: first, orderNo: 'ORD-SP  ', refundNo: 'RF-SP-2' });
      expect([notThere.status, notThere.body.code]).toEqual([409, 'NOT_REDEEMED']);
      expect(await count(`SELECT COUNT(*) AS n FROM refund WHERE refund_no LIKE 'RF-SP%'`)).toBe(2);
      // Spaces alone name no order and no refund.
      for (const blank of [
        { userCouponId: first, orderNo: ' ', refundNo: 'RF-SP-3' },
        { userCouponId: first, orderNo: 'ORD-SP', refundNo: '  ' },
      ]) {
        const res = await refund(blank);
        expect([res.status, res.body.code, JSON.stringify(res.body.details)]).toEqual([
          400,
          'VALIDATION_FAILED',
          expect.stringMatching(/not only spaces/),
        ]);
      }
    });

    it('answers REFUND_RETURN_DISABLED, NOT_REDEEMED, 404, 422 and 403 as it should, writing nothing', async () => {
      const plain = await userCoupon('r2');
      await redeem(tokenFor('r2'), { userCouponId: plain, orderNo: 'P-1', orderAmountCents: 10000 });
      const disabled = await refund({ userCouponId: plain, orderNo: 'P-1', refundNo: 'N-1' });
      expect([disabled.status, disabled.body.code]).toEqual([409, 'REFUND_RETURN_DISABLED']);
      const returning = await userCoupon('r2', { returnOnRefund: true });
      const notRedeemed = await refund({ userCouponId: returning, orderNo: 'P-2', refundNo: 'N-2' });
      expect([notRedeemed.status, notRedeemed.body.code]).toEqual([409, 'NOT_REDEEMED']);
      const missing = await refund({ userCouponId: '987654321', orderNo: 'P-2', refundNo: 'N-3' });
      expect([missing.status, missing.body.code, missing.body.message]).toEqual([
        404,
        'USER_COUPON_NOT_FOUND',
        'User coupon 987654321 does not exist',
      ]);
      const byUser = await refund({ userCouponId: plain, orderNo: 'P-1', refundNo: 'N-4' }, tokenFor('r2'));
      expect([byUser.status, byUser.body.code]).toEqual([403, 'FORBIDDEN']);
      await redeem(tokenFor('r2'), { userCouponId: returning, orderNo: 'P-3', orderAmountCents: 10000 });
      expect((await refund({ userCouponId: returning, orderNo: 'P-3', refundNo: 'N-5' })).status).toBe(201);
      const reused = await refund({ userCouponId: plain, orderNo: 'P-1', refundNo: 'N-5' });
      expect([reused.status, reused.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
      expect(await count(`SELECT COUNT(*) AS n FROM refund WHERE user_coupon_id IN (?, ?)`, [plain, returning])).toBe(1);
    });
  });
});
