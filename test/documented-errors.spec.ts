import request from 'supertest';
import { createCoupon } from './support/factories.js';
import { adminToken, bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';

/**
 * Documented error answers no other suite provokes (see test-results/contract-coverage.txt): each
 * is sent here so the harness checks it against docs/openapi.json like every other answer.
 */
describe('documented errors', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ WEBHOOK_ALLOWED_HOSTS: 'hooks.example.org' });
  });
  afterAll(() => t.close());

  const admin = () => bearer(adminToken());

  it('unknown coupons are 404 COUPON_NOT_FOUND on every admin coupon route', async () => {
    const answers = await Promise.all([
      request(t.url).get('/admin/coupons/999999').set(admin()),
      request(t.url).patch('/admin/coupons/999999').set(admin()).send({ status: 'PAUSED' }),
      request(t.url).post('/admin/coupons/999999/stock').set(admin()).send({ delta: 5 }),
    ]);
    expect(answers.map((r) => [r.status, r.body.code])).toEqual(Array.from({ length: 3 }, () => [404, 'COUPON_NOT_FOUND']));
  });

  it('a redemption body over 64 KiB is 413 PAYLOAD_TOO_LARGE', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 1 });
    const res = await request(t.url)
      .post('/redemptions')
      .set(bearer(tokenFor('big-body')))
      .send({ userCouponId: coupon.id, orderNo: 'x'.repeat(70_000), orderAmountCents: 1 });
    expect([res.status, res.body.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
  });

  it('webhooks: a host off WEBHOOK_ALLOWED_HOSTS is 422 WEBHOOK_URL_NOT_ALLOWED, an unknown endpoint 404 WEBHOOK_NOT_FOUND', async () => {
    const refused = await request(t.url).post('/admin/webhooks').set(admin()).send({ url: 'https://internal.example.net/hook' });
    expect([refused.status, refused.body.code]).toEqual([422, 'WEBHOOK_URL_NOT_ALLOWED']);
    const created = await request(t.url).post('/admin/webhooks').set(admin()).send({ url: 'https://hooks.example.org/coupons' });
    expect(created.status).toBe(201);
    const moved = await request(t.url)
      .patch(`/admin/webhooks/${created.body.id}`)
      .set(admin())
      .send({ url: 'https://internal.example.net/hook' });
    expect([moved.status, moved.body.code]).toEqual([422, 'WEBHOOK_URL_NOT_ALLOWED']);
    const missing = await request(t.url).patch('/admin/webhooks/999999').set(admin()).send({ enabled: false });
    expect([missing.status, missing.body.code]).toEqual([404, 'WEBHOOK_NOT_FOUND']);
    const noDeliveries = await request(t.url).get('/admin/webhooks/999999/deliveries').set(admin());
    expect([noDeliveries.status, noDeliveries.body.code]).toEqual([404, 'WEBHOOK_NOT_FOUND']);
    expect((await request(t.url).delete(`/admin/webhooks/${created.body.id}`).set(admin())).status).toBe(204);
  });
});
