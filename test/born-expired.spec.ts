import request from 'supertest';
import { IssuanceRunner } from '../src/issuance/issuance-runner.js';
import { createCoupon, grabUserCoupon, newKey, redeemUserCoupon } from './support/factories.js';
import { checkInvariantsAfterEach } from './support/scoped-invariants.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp } from './support/harness.js';

const HOUR = 3600_000;

/**
 * No route hands out a coupon born EXPIRED. Grabs end with the validity (grab.spec); here the other
 * ways a coupon is issued: a refund's replacement, a reissue, a bulk job. Each template is created
 * valid and its fixed validity moved into the past in SQL, as the clock would.
 */
describe('no coupon is issued after its fixed validity ended', () => {
  let t: TestApp;
  const admin = () => bearer(adminToken());
  beforeAll(async () => {
    t = await startTestApp();
  });
  checkInvariantsAfterEach(() => t.db);
  afterAll(() => t.close());

  async function couponEndingSoon(): Promise<string> {
    const start = new Date(Date.now() - HOUR).toISOString();
    const end = new Date(Date.now() + HOUR).toISOString();
    return (await createCoupon(t.url, { totalStock: 10, returnOnRefund: true, validity: { type: 'FIXED', startAt: start, endAt: end } }))
      .id;
  }
  /** Ends the template's validity now and answers the time as the API writes it. */
  async function endValidity(couponId: string): Promise<string> {
    const endedAt = new Date(Math.floor(Date.now() / 1000) * 1000 - 1000);
    await t.db.query(`UPDATE coupon SET validity_end_at = ? WHERE id = ?`, [endedAt, couponId]);
    return endedAt.toISOString();
  }
  const issuedOf = async (couponId: string) =>
    Number(((await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId])) as { n: string }[])[0].n);

  it('a refund whose replacement would be born expired is recorded without one: the order is refunded, its holds released', async () => {
    const couponId = await couponEndingSoon();
    const uc = await grabUserCoupon(t.url, couponId, 'refunded');
    const { orderNo } = await redeemUserCoupon(t.url, uc.id, 'refunded');
    // Another coupon held on the same (stackable) order, which the refund lets go.
    const other = await createCoupon(t.url, { stackable: true, perUserLimit: 2 });
    const held = await grabUserCoupon(t.url, other.id, 'refunded');
    await t.db.query(`UPDATE coupon SET stackable = 1 WHERE id = ?`, [couponId]);
    const hold = await request(t.url)
      .post('/redemptions/holds')
      .set(bearer(serviceToken()))
      .send({ userCouponId: held.id, orderNo, orderAmountCents: 20000, userId: 'refunded' });
    expect(hold.status).toBe(201);
    await endValidity(couponId);
    const refundNo = newKey('R');
    const refund = () =>
      request(t.url).post('/redemptions/refunds').set(bearer(serviceToken())).send({ userCouponId: uc.id, orderNo, refundNo });
    const res = await refund();
    expect([res.status, res.body.refundNo, res.body.replacementUserCoupon]).toEqual([201, refundNo, null]);
    expect(await issuedOf(couponId)).toBe(1);
    const again = await refund();
    expect([again.status, again.headers['idempotent-replayed'], again.body]).toEqual([201, 'true', res.body]);
    const [{ status }] = (await t.db.query(`SELECT status FROM redemption_hold WHERE id = ?`, [hold.body.holdId])) as { status: string }[];
    expect(status).toBe('RELEASED');
    const late = async (userCouponId: string) =>
      (
        await request(t.url)
          .post('/redemptions')
          .set(bearer(serviceToken()))
          .send({ userCouponId, orderNo, orderAmountCents: 20000, userId: 'refunded' })
      ).body.code as string;
    expect(await late(held.id)).toBe('HOLD_RELEASED');
    expect(await late((await grabUserCoupon(t.url, other.id, 'refunded', newKey())).id)).toBe('ORDER_REFUNDED');
  });

  it('a reissue is 409 COUPON_EXPIRED; a repeat of its key with another reason is 422', async () => {
    const couponId = await couponEndingSoon();
    const reissue = (reason: string, key: string) =>
      request(t.url)
        .post('/admin/user-coupons/reissue')
        .set(admin())
        .set('Idempotency-Key', key)
        .send({ couponId, userId: 'reissued', reason, fromStock: false });
    const key = newKey('reissue');
    expect((await reissue('sorry', key)).status).toBe(201);
    const other = await reissue('another reason', key);
    expect([other.status, other.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    const endedAt = await endValidity(couponId);
    const late = await reissue('sorry', newKey('reissue'));
    expect([late.status, late.body.code, late.body.details]).toEqual([409, 'COUPON_EXPIRED', { validityEndedAt: endedAt }]);
    expect(await issuedOf(couponId)).toBe(1);
  });

  it("a reissue that waited for the coupon it replaces past the validity's end is 409 COUPON_EXPIRED, not a coupon born expired", async () => {
    const couponId = await couponEndingSoon();
    const replaced = await grabUserCoupon(t.url, couponId, 'waited');
    const endsAt = Math.floor(Date.now() / 1000) * 1000 + 2000;
    await t.db.query(`UPDATE coupon SET validity_end_at = ? WHERE id = ?`, [new Date(endsAt), couponId]);
    // Another operator's repair of that coupon holds its row across the end.
    const runner = t.db.createQueryRunner();
    await runner.startTransaction();
    try {
      await runner.query(`SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`, [replaced.id]);
      const reissuing = request(t.url)
        .post('/admin/user-coupons/reissue')
        .set(admin())
        .set('Idempotency-Key', newKey('reissue'))
        .send({ couponId, userId: 'waited', reason: 'lost', fromStock: false, replacesUserCouponId: replaced.id })
        .then((r) => r);
      await new Promise((r) => setTimeout(r, endsAt + 300 - Date.now()));
      await runner.commitTransaction();
      const late = await reissuing;
      expect([late.status, late.body.code]).toEqual([409, 'COUPON_EXPIRED']);
    } finally {
      if (runner.isTransactionActive) await runner.rollbackTransaction();
      await runner.release();
    }
    expect(await issuedOf(couponId)).toBe(1);
  });

  it('a bulk job skips the lines it reaches after the validity ended (COUPON_EXPIRED); a new job for the coupon is refused', async () => {
    const couponId = await couponEndingSoon();
    const post = () =>
      request(t.url)
        .post(`/admin/coupons/${couponId}/issuances`)
        .set(admin())
        .set('Idempotency-Key', newKey('bulk'))
        .send({ userIds: ['late-1', 'late-2', 'late-3'], reason: 'r', fromStock: true });
    const created = await post();
    expect(created.status).toBe(202);
    const endedAt = await endValidity(couponId);
    await t.app.get(IssuanceRunner).runQueued();
    const job = (await request(t.url).get(`/admin/issuance-jobs/${created.body.jobId}`).set(admin())).body;
    expect(job).toMatchObject({ status: 'COMPLETED', issued: 0, skipped: 3, skippedByReason: { COUPON_EXPIRED: 3, SOLD_OUT: 0 } });
    const skips = await request(t.url).get(`/admin/issuance-jobs/${created.body.jobId}/skipped`).set(admin());
    expect(skips.body.items.map((s: { reason: string }) => s.reason)).toEqual(['COUPON_EXPIRED', 'COUPON_EXPIRED', 'COUPON_EXPIRED']);
    expect(await issuedOf(couponId)).toBe(0);
    // The template the route reads is cached for COUPON_CACHE_TTL_MS.
    await new Promise((r) => setTimeout(r, t.config.COUPON_CACHE_TTL_MS + 100));
    const refused = await post();
    expect([refused.status, refused.body.code, refused.body.details]).toEqual([409, 'COUPON_EXPIRED', { validityEndedAt: endedAt }]);
  });
});
