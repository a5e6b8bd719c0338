import { readFileSync } from 'node:fs';
import createClient from 'openapi-fetch';
import type { paths } from '../client/schema.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';

/**
 * A client generated from docs/openapi.json and nothing else (openapi-typescript types, openapi-fetch
 * calls) runs a coupon's whole life: the document is usable as it is.
 */
describe('the typed client generated from the document', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  const client = (token?: string) => createClient<paths>({ baseUrl: t.url, headers: token ? bearer(token) : {} });
  const exampleOf = (path: string, method: string): unknown =>
    (
      JSON.parse(readFileSync('docs/openapi.json', 'utf8')) as {
        paths: Record<string, Record<string, { requestBody: { content: Record<string, { example: unknown }> } }>>;
      }
    ).paths[path][method].requestBody.content['application/json'].example;

  it('creates a coupon from the example body Swagger UI offers, grabs, redeems, replays and refunds it', async () => {
    const admin = client(adminToken());
    const example = exampleOf('/admin/coupons', 'post') as NonNullable<
      paths['/admin/coupons']['post']['requestBody']
    >['content']['application/json'];
    const created = await admin.POST('/admin/coupons', { body: { ...example, returnOnRefund: true } });
    expect(created.response.status).toBe(201);
    const couponId = created.data!.id;
    expect(created.data).toMatchObject({
      name: example.name,
      initStock: example.totalStock,
      remainingStock: example.totalStock,
      returnOnRefund: true,
    });

    const publicView = await client().GET('/coupons/{couponId}', { params: { path: { couponId } } });
    expect(publicView.data?.remainingStock).toBe(example.totalStock);

    const alice = client(tokenFor('alice'));
    const grabbed = await alice.POST('/coupons/{couponId}/grab', {
      params: { path: { couponId }, header: { 'Idempotency-Key': 'client-flow-1' } },
    });
    expect([grabbed.response.status, grabbed.data?.status, grabbed.data?.source]).toEqual([201, 'UNUSED', 'GRAB']);
    const userCouponId = grabbed.data!.id;
    const again = await alice.POST('/coupons/{couponId}/grab', {
      params: { path: { couponId }, header: { 'Idempotency-Key': 'client-flow-1' } },
    });
    expect([again.data?.id, again.response.headers.get('idempotent-replayed')]).toEqual([userCouponId, 'true']);
    const lookedUp = await alice.GET('/grabs/{idempotencyKey}', { params: { path: { idempotencyKey: 'client-flow-1' } } });
    expect(lookedUp.data?.id).toBe(userCouponId);
    const mine = await alice.GET('/me/coupons', { params: { query: { status: 'UNUSED', limit: 10 } } });
    expect(mine.data?.items.map((c) => c.id)).toEqual([userCouponId]);

    const order = { userCouponId, orderNo: 'CLIENT-ORDER-1', orderAmountCents: 20000 };
    const redeemed = await alice.POST('/redemptions', { body: order });
    expect([redeemed.response.status, redeemed.data?.firstUse, redeemed.data?.discountCents]).toEqual([201, true, 1000]);
    const replayed = await client(serviceToken()).POST('/redemptions', { body: { ...order, userId: 'alice' } });
    expect([replayed.response.status, replayed.data?.firstUse, replayed.response.headers.get('idempotent-replayed')]).toEqual([
      200,
      false,
      'true',
    ]);
    const otherAmount = await alice.POST('/redemptions', { body: { ...order, orderAmountCents: 30000 } });
    expect([otherAmount.response.status, otherAmount.error?.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);

    const refunded = await client(serviceToken()).POST('/redemptions/refunds', {
      body: { userCouponId, orderNo: order.orderNo, refundNo: 'CLIENT-REFUND-1' },
    });
    expect([refunded.response.status, refunded.data?.replacementUserCoupon?.source]).toEqual([201, 'REFUND_RETURN']);

    const counted = await admin.GET('/admin/coupons/{couponId}', { params: { path: { couponId } } });
    expect(counted.data?.counts).toEqual({ issued: 2, issuedFromStock: 1, unused: 1, locked: 0, used: 1, expired: 0, void: 0 });
    const history = await admin.GET('/admin/user-coupons/{userCouponId}/history', { params: { path: { userCouponId } } });
    expect([history.data?.consistent, history.data?.transitions.map((s) => s.to)]).toEqual([true, ['UNUSED', 'USED']]);
  });

  it('is served at /docs-json exactly as committed', async () => {
    const served = await fetch(`${t.url}/docs-json`);
    expect(await served.json()).toEqual(JSON.parse(readFileSync('docs/openapi.json', 'utf8')));
  });

  it('reads typed errors', async () => {
    const missing = await client(tokenFor('bob')).GET('/me/coupons/{userCouponId}', { params: { path: { userCouponId: '999999' } } });
    expect([missing.response.status, missing.error?.code, missing.data]).toEqual([404, 'USER_COUPON_NOT_FOUND', undefined]);
    const forbidden = await client(tokenFor('bob')).GET('/admin/reconciliation/runs', {});
    expect([forbidden.response.status, forbidden.error?.code]).toEqual([403, 'FORBIDDEN']);
  });
});
