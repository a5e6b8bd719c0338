// The reissue and refund links are shown in the UserCoupon view, wherever it is answered.
import request from 'supertest';
import { createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';

describe('replacesUserCouponId', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  const grab = async (couponId: string, user: string) => {
    const res = await request(t.url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor(user)))
      .set('Idempotency-Key', newKey());
    expect(res.status).toBe(201);
    return res.body as { id: string; replacesUserCouponId: string | null };
  };

  it('a grabbed coupon replaces nothing', async () => {
    const coupon = await createCoupon(t.url);
    expect((await grab(coupon.id, 'links-a')).replacesUserCouponId).toBeNull();
  });

  it('a reissue names the coupon it replaces, in its answer, in my coupons and in its history', async () => {
    const coupon = await createCoupon(t.url);
    const original = await grab(coupon.id, 'links-b');
    const reissued = await request(t.url)
      .post('/admin/user-coupons/reissue')
      .set(bearer(adminToken()))
      .send({ couponId: coupon.id, userId: 'links-b', reason: 'support ticket 7', fromStock: false, replacesUserCouponId: original.id });
    expect([reissued.status, reissued.body.source, reissued.body.replacesUserCouponId]).toEqual([201, 'REISSUE', original.id]);
    const mine = await request(t.url)
      .get(`/me/coupons/${reissued.body.id}`)
      .set(bearer(tokenFor('links-b')));
    expect(mine.body.replacesUserCouponId).toBe(original.id);
    const history = await request(t.url).get(`/admin/user-coupons/${reissued.body.id}/history`).set(bearer(adminToken()));
    expect(history.body.userCoupon.replacesUserCouponId).toBe(original.id);
    const unlinked = await request(t.url)
      .post('/admin/user-coupons/reissue')
      .set(bearer(adminToken()))
      .send({ couponId: coupon.id, userId: 'links-b', reason: 'goodwill', fromStock: false });
    expect(unlinked.body.replacesUserCouponId).toBeNull();
  });

  it('a refund return names the coupon used on the refunded order', async () => {
    const coupon = await createCoupon(t.url, { returnOnRefund: true });
    const used = await grab(coupon.id, 'links-c');
    const order = { userCouponId: used.id, orderNo: `links-order-${newKey()}`, userId: 'links-c' };
    expect(
      (
        await request(t.url)
          .post('/redemptions')
          .set(bearer(serviceToken()))
          .send({ ...order, orderAmountCents: 20_000 })
      ).status,
    ).toBe(201);
    const refund = await request(t.url)
      .post('/redemptions/refunds')
      .set(bearer(serviceToken()))
      .send({ userCouponId: used.id, orderNo: order.orderNo, refundNo: `links-refund-${newKey()}` });
    expect(refund.status).toBe(201);
    expect(refund.body.replacementUserCoupon).toMatchObject({ source: 'REFUND_RETURN', replacesUserCouponId: used.id });
    const list = await request(t.url)
      .get('/me/coupons')
      .set(bearer(tokenFor('links-c')));
    const replacement = (list.body.items as { id: string; replacesUserCouponId: string | null }[]).find(
      (uc) => uc.id === refund.body.replacementUserCoupon.id,
    );
    expect(replacement?.replacesUserCouponId).toBe(used.id);
  });

  it('a coupon is made good once: a refund of one an operator replaced already records no second replacement, and a reissue after the refund is 409', async () => {
    const coupon = await createCoupon(t.url, { returnOnRefund: true });
    const used = await grab(coupon.id, 'links-d');
    const orderNo = `links-order-${newKey()}`;
    const service = (path: string, body: Record<string, unknown>) => request(t.url).post(path).set(bearer(serviceToken())).send(body);
    expect((await service('/redemptions', { userCouponId: used.id, orderNo, userId: 'links-d', orderAmountCents: 20_000 })).status).toBe(
      201,
    );
    const reissue = () =>
      request(t.url)
        .post('/admin/user-coupons/reissue')
        .set(bearer(adminToken()))
        .send({ couponId: coupon.id, userId: 'links-d', reason: 'order went wrong', fromStock: false, replacesUserCouponId: used.id });
    const reissued = await reissue();
    expect(reissued.status).toBe(201);
    const refund = await service('/redemptions/refunds', { userCouponId: used.id, orderNo, refundNo: `links-refund-${newKey()}` });
    expect([refund.status, refund.body.replacementUserCoupon]).toEqual([201, null]);
    const again = await reissue();
    expect([again.status, again.body.code, again.body.details]).toEqual([
      409,
      'ALREADY_REPLACED',
      { userCouponId: used.id, replacedBy: reissued.body.id },
    ]);
  });
});
