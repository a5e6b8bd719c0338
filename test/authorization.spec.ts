import { createHmac } from 'node:crypto';
import request from 'supertest';
import { createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, TEST_SECRET, TestApp, tokenFor } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { databaseFingerprint } from './support/fingerprint.js';

type Method = 'get' | 'post' | 'patch';
interface Route {
  method: Method;
  /** OpenAPI form: /admin/coupons/{couponId} */
  path: string;
}

/** Every route of API.md; the OpenAPI document must list each of them, and the tests cover whatever it lists. */
const API_ROUTES: readonly Route[] = [
  { method: 'get', path: '/coupons' },
  { method: 'get', path: '/coupons/{couponId}' },
  { method: 'post', path: '/coupons/{couponId}/grab' },
  { method: 'get', path: '/grabs/{idempotencyKey}' },
  { method: 'get', path: '/me/coupons' },
  { method: 'get', path: '/me/coupons/usable' },
  { method: 'get', path: '/me/coupons/{userCouponId}' },
  { method: 'post', path: '/redemptions' },
  { method: 'post', path: '/redemptions/refunds' },
  { method: 'post', path: '/redemptions/holds' },
  { method: 'post', path: '/redemptions/holds/release' },
  { method: 'post', path: '/admin/coupons' },
  { method: 'get', path: '/admin/coupons/{couponId}' },
  { method: 'patch', path: '/admin/coupons/{couponId}' },
  { method: 'post', path: '/admin/coupons/{couponId}/stock' },
  { method: 'post', path: '/admin/user-coupons/{userCouponId}/void' },
  { method: 'post', path: '/admin/user-coupons/reissue' },
  { method: 'get', path: '/admin/user-coupons/{userCouponId}/history' },
  { method: 'post', path: '/admin/reconciliation/runs' },
  { method: 'get', path: '/admin/reconciliation/runs' },
  { method: 'get', path: '/admin/reconciliation/runs/{runId}' },
  { method: 'get', path: '/admin/compensations' },
  { method: 'post', path: '/admin/compensations/{id}/approve' },
  { method: 'post', path: '/admin/compensations/{id}/reject' },
];
// /metrics is public unless METRICS_TOKEN is set (these tests leave it unset).
const PUBLIC = new Set(['get /coupons', 'get /coupons/{couponId}', 'get /health', 'get /metrics']);
const SERVICE_ONLY = new Set(['post /redemptions/refunds']);
const label = (r: Route) => `${r.method} ${r.path}`;

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
const now = () => Math.floor(Date.now() / 1000);
/** Signs by hand: a JWT library refuses to sign many of the malformed claims below. */
function sign(payload: object, secret = TEST_SECRET, alg: 'HS256' | 'HS512' = 'HS256'): string {
  const unsigned = `${b64({ alg, typ: 'JWT' })}.${b64(payload)}`;
  return `${unsigned}.${createHmac(alg === 'HS256' ? 'sha256' : 'sha512', secret)
    .update(unsigned)
    .digest('base64url')}`;
}

/** Tokens API.md says must be refused with 401, each claiming admin so that a leak would show as a 2xx or 403. */
const BAD_TOKENS: Record<string, string> = {
  expired: sign({ sub: 'mallory', roles: ['admin'], exp: now() - 60 }),
  'forged (wrong secret)': sign({ sub: 'mallory', roles: ['admin'], exp: now() + 3600 }, 'not-the-secret-0123456789abcdef'),
  'alg none': `${b64({ alg: 'none', typ: 'JWT' })}.${b64({ sub: 'mallory', roles: ['admin'], exp: now() + 3600 })}.`,
  'alg none with a signature': `${b64({ alg: 'none', typ: 'JWT' })}.${b64({ sub: 'mallory', roles: ['admin'], exp: now() + 3600 })}.${'A'.repeat(43)}`,
  'HS512 instead of HS256': sign({ sub: 'mallory', roles: ['admin'], exp: now() + 3600 }, TEST_SECRET, 'HS512'),
  'missing exp': sign({ sub: 'mallory', roles: ['admin'] }),
  'exp as a string': sign({ sub: 'mallory', roles: ['admin'], exp: String(now() + 3600) }),
  'not valid yet (nbf)': sign({ sub: 'mallory', roles: ['admin'], exp: now() + 3600, nbf: now() + 600 }),
  'missing sub': sign({ roles: ['admin'], exp: now() + 3600 }),
  'empty sub': sign({ sub: '', roles: ['admin'], exp: now() + 3600 }),
  'numeric sub': sign({ sub: 42, roles: ['admin'], exp: now() + 3600 }),
  'sub with a space': sign({ sub: 'mal lory', roles: ['admin'], exp: now() + 3600 }),
  'sub with a slash': sign({ sub: '../admin', roles: ['admin'], exp: now() + 3600 }),
  'sub of 65 characters': sign({ sub: 'm'.repeat(65), roles: ['admin'], exp: now() + 3600 }),
  'roles as a string': sign({ sub: 'mallory', roles: 'admin', exp: now() + 3600 }),
  'unknown role': sign({ sub: 'mallory', roles: ['admin', 'root'], exp: now() + 3600 }),
  'role of the wrong type': sign({ sub: 'mallory', roles: [1], exp: now() + 3600 }),
  'roles as an object': sign({ sub: 'mallory', roles: { admin: true }, exp: now() + 3600 }),
  'payload not JSON': `${b64({ alg: 'HS256', typ: 'JWT' })}.${Buffer.from('not json').toString('base64url')}.abc`,
  'two segments': 'abc.def',
  garbage: 'not-a-token',
  'truncated signature': adminToken().slice(0, -5),
  'signature of another token': (() => {
    const [h, p] = sign({ sub: 'mallory', roles: ['admin'], exp: now() + 3600 }).split('.');
    return `${h}.${p}.${tokenFor('mallory').split('.')[2]}`;
  })(),
};
/** Authorization headers that carry no usable bearer token at all. */
const BAD_HEADERS: Record<string, string> = {
  'empty header': '',
  'scheme only': 'Bearer',
  'scheme and space': 'Bearer ',
  'Basic scheme': `Basic ${Buffer.from('admin:admin').toString('base64')}`,
  'token without scheme': adminToken(),
  'two tokens': `Bearer ${adminToken()} ${adminToken()}`,
};

describe('authorization', () => {
  let t: TestApp;
  let routes: Route[];
  let documentedPublic: string[];
  let ids: Record<string, string>;

  beforeAll(async () => {
    t = await startTestApp();
    const doc = (await request(t.url).get('/docs-json')).body as { paths: Record<string, Record<string, { security?: unknown[] }>> };
    routes = Object.entries(doc.paths).flatMap(([path, ops]) => Object.keys(ops).map((method) => ({ method: method as Method, path })));
    documentedPublic = routes.filter((r) => doc.paths[r.path][r.method].security?.length === 0).map(label);
    const coupon = await createCoupon(t.url, { totalStock: 10, returnOnRefund: true });
    const key = newKey('victim');
    const grabbed = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor('victim')))
      .set('Idempotency-Key', key);
    expect(grabbed.status).toBe(201);
    ids = { couponId: coupon.id, userCouponId: grabbed.body.id, idempotencyKey: key, runId: '1', id: '1' };
  });
  afterAll(() => t.close());

  const urlOf = (r: Route) => r.path.replace(/\{(\w+)\}/g, (_, name: string) => ids[name] ?? '1');
  /** A well-formed body, so that only the credentials can be the reason for a refusal. */
  const bodyOf = (r: Route) => (r.method === 'get' ? undefined : {});
  const send = (r: Route, authorization?: string) => {
    const req = request(t.url)[r.method](urlOf(r));
    if (authorization !== undefined) req.set('Authorization', authorization);
    const body = bodyOf(r);
    return body === undefined ? req : req.send(body);
  };
  const protectedRoutes = () => routes.filter((r) => !PUBLIC.has(label(r)));

  it('the OpenAPI document lists every route of API.md, and says `security: []` on exactly the public ones', () => {
    expect(routes.map(label)).toEqual(expect.arrayContaining(API_ROUTES.map(label)));
    expect(documentedPublic.sort()).toEqual([...PUBLIC].sort());
  });

  it('without a token every route but the public ones answers 401 UNAUTHENTICATED', async () => {
    const unprotected: string[] = [];
    for (const r of routes) {
      const res = await send(r);
      if (res.status !== 401) unprotected.push(`${label(r)} -> ${res.status}`);
      else expect(res.body).toEqual({ code: 'UNAUTHENTICATED', message: expect.any(String) });
    }
    expect(unprotected.sort()).toEqual([
      'get /coupons -> 200',
      'get /coupons/{couponId} -> 200',
      'get /health -> 200',
      'get /metrics -> 200',
    ]);
  });

  it('control: a token signed by hand the same way, with nothing wrong, is accepted as admin', async () => {
    const res = await request(t.url)
      .get(`/admin/coupons/${ids.couponId}`)
      .set(bearer(sign({ sub: 'mallory', roles: ['admin'], exp: now() + 3600 })));
    expect(res.status).toBe(200);
  });

  it('takes the scheme in any case (RFC 7235: bearer, BEARER), and only with one space before the token', async () => {
    for (const scheme of ['bearer', 'BEARER', 'bEaReR']) {
      const res = await request(t.url).get(`/admin/coupons/${ids.couponId}`).set('Authorization', `${scheme} ${adminToken()}`);
      expect([scheme, res.status]).toEqual([scheme, 200]);
    }
    const twoSpaces = await request(t.url).get(`/admin/coupons/${ids.couponId}`).set('Authorization', `Bearer  ${adminToken()}`);
    expect(twoSpaces.status).toBe(401);
  });

  it.each(Object.keys(BAD_TOKENS))(
    'a token that is %s gets 401 UNAUTHENTICATED on every protected route, and nothing changes',
    async (kind) => {
      const before = await databaseFingerprint(t.db);
      for (const r of protectedRoutes()) {
        const res = await send(r, `Bearer ${BAD_TOKENS[kind]}`);
        expect({ route: label(r), status: res.status, body: res.body }).toEqual({
          route: label(r),
          status: 401,
          body: { code: 'UNAUTHENTICATED', message: expect.any(String) },
        });
      }
      expect(await databaseFingerprint(t.db)).toEqual(before);
    },
  );

  it.each(Object.keys(BAD_HEADERS))('an Authorization header that is %s gets 401 on every protected route', async (kind) => {
    for (const r of protectedRoutes()) {
      const res = await send(r, BAD_HEADERS[kind]);
      expect({ route: label(r), status: res.status, code: res.body.code }).toEqual({
        route: label(r),
        status: 401,
        code: 'UNAUTHENTICATED',
      });
    }
  });

  it('a user token gets 403 FORBIDDEN on every admin route and on refunds, and nothing changes', async () => {
    const denied = routes.filter((r) => r.path.startsWith('/admin/') || SERVICE_ONLY.has(label(r)));
    expect(denied.length).toBeGreaterThanOrEqual(API_ROUTES.filter((r) => r.path.startsWith('/admin/')).length + 1);
    const before = await databaseFingerprint(t.db);
    for (const r of denied) {
      for (const token of [tokenFor('victim'), tokenFor('mallory', [])]) {
        const res = await send(r, `Bearer ${token}`);
        expect({ route: label(r), status: res.status, body: res.body }).toEqual({
          route: label(r),
          status: 403,
          body: { code: 'FORBIDDEN', message: expect.any(String) },
        });
      }
    }
    expect(await databaseFingerprint(t.db)).toEqual(before);
  });

  it('a service token gets 403 on every admin route, an admin token 403 on refunds', async () => {
    const before = await databaseFingerprint(t.db);
    for (const r of routes.filter((x) => x.path.startsWith('/admin/'))) {
      const res = await send(r, `Bearer ${serviceToken()}`);
      expect({ route: label(r), status: res.status, code: res.body.code }).toEqual({ route: label(r), status: 403, code: 'FORBIDDEN' });
    }
    for (const r of routes.filter((x) => SERVICE_ONLY.has(label(x)))) {
      const res = await send(r, `Bearer ${adminToken()}`);
      expect({ route: label(r), status: res.status, code: res.body.code }).toEqual({ route: label(r), status: 403, code: 'FORBIDDEN' });
    }
    expect(await databaseFingerprint(t.db)).toEqual(before);
  });

  describe("another user's ids", () => {
    const mallory = () => bearer(tokenFor('mallory'));

    it('GET /me/coupons/:id of the victim is 404 USER_COUPON_NOT_FOUND, like an id that does not exist', async () => {
      const theirs = await request(t.url).get(`/me/coupons/${ids.userCouponId}`).set(mallory());
      const missing = await request(t.url).get(`/me/coupons/999999999`).set(mallory());
      expect([theirs.status, theirs.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
      expect(theirs.body.message).toBe(missing.body.message);
      const own = await request(t.url)
        .get(`/me/coupons/${ids.userCouponId}`)
        .set(bearer(tokenFor('victim')));
      expect(own.status).toBe(200);
    });

    it("GET /grabs/:key with the victim's key is 404 GRAB_NOT_FOUND", async () => {
      const res = await request(t.url).get(`/grabs/${ids.idempotencyKey}`).set(mallory());
      expect([res.status, res.body.code]).toEqual([404, 'GRAB_NOT_FOUND']);
    });

    it("GET /me/coupons never lists the victim's coupon, whatever the cursor or status", async () => {
      for (const query of ['', '?status=UNUSED', `?cursor=${BigInt(ids.userCouponId) + 1n}`, '?limit=100']) {
        const res = await request(t.url).get(`/me/coupons${query}`).set(mallory());
        expect(res.status).toBe(200);
        expect(res.body.items).toEqual([]);
      }
    });

    it("redeeming the victim's coupon is refused (404, or 403 when naming the victim) and changes nothing", async () => {
      const before = await databaseFingerprint(t.db);
      const plain = await request(t.url)
        .post('/redemptions')
        .set(mallory())
        .send({ userCouponId: ids.userCouponId, orderNo: 'M-1', orderAmountCents: 100000 });
      expect([plain.status, plain.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
      const named = await request(t.url)
        .post('/redemptions')
        .set(mallory())
        .send({ userCouponId: ids.userCouponId, orderNo: 'M-2', orderAmountCents: 100000, userId: 'victim' });
      expect([403, 404]).toContain(named.status);
      expect(named.body.code).toBe(named.status === 403 ? 'FORBIDDEN' : 'USER_COUPON_NOT_FOUND');
      // The service acting for the wrong user is refused the same way.
      const wrongUser = await request(t.url)
        .post('/redemptions')
        .set(bearer(serviceToken()))
        .send({ userCouponId: ids.userCouponId, orderNo: 'M-3', orderAmountCents: 100000, userId: 'mallory' });
      expect([wrongUser.status, wrongUser.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
      expect(await databaseFingerprint(t.db)).toEqual(before);
    });

    it("a grab with the victim's Idempotency-Key gives mallory a coupon of her own, never the victim's", async () => {
      const res = await request(t.url).post(`/coupons/${ids.couponId}/grab`).set(mallory()).set('Idempotency-Key', ids.idempotencyKey);
      expect(res.status).toBe(201);
      expect(res.headers['idempotent-replayed']).toBeUndefined();
      expect(res.body.userId).toBe('mallory');
      expect(res.body.id).not.toBe(ids.userCouponId);
    });

    it("the victim's coupon is untouched: UNUSED, one log row, no redemption", async () => {
      const [uc] = (await t.db.query(`SELECT user_id, status FROM user_coupon WHERE id = ?`, [ids.userCouponId])) as {
        user_id: string;
        status: string;
      }[];
      expect(uc).toEqual({ user_id: 'victim', status: 'UNUSED' });
      const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon_state_log WHERE user_coupon_id = ?`, [
        ids.userCouponId,
      ])) as { n: string }[];
      expect(Number(n)).toBe(1);
      const [{ r }] = (await t.db.query(`SELECT COUNT(*) AS r FROM redemption WHERE user_coupon_id = ?`, [ids.userCouponId])) as {
        r: string;
      }[];
      expect(Number(r)).toBe(0);
      expect(await checkInvariants(t.db)).toEqual([]);
    });
  });
});

describe('REDEMPTIONS_BY_USERS=false: only the order service puts coupons on orders', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ REDEMPTIONS_BY_USERS: 'false' });
  });
  afterAll(() => t.close());

  it("a shopper's own token can no longer hold, redeem or release, so no order number can be taken first; the order service can", async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10, perUserLimit: 2 });
    const grab = async (user: string) =>
      (
        await request(t.url)
          .post(`/coupons/${coupon.id}/grab`)
          .set(bearer(tokenFor(user)))
          .set('Idempotency-Key', newKey())
      ).body.id as string;
    const [mallory, victim] = [await grab('mallory'), await grab('victim')];
    const orderNo = newKey('victims-order');
    const as = (token: string, path: string, body: Record<string, unknown>) => request(t.url).post(path).set(bearer(token)).send(body);
    const squat = { userCouponId: mallory, orderNo, orderAmountCents: 0 };
    for (const path of ['/redemptions/holds', '/redemptions', '/redemptions/holds/release']) {
      const res = await as(tokenFor('mallory'), path, path.endsWith('release') ? { userCouponId: mallory, orderNo } : squat);
      expect([path, res.status, res.body.code]).toEqual([path, 403, 'FORBIDDEN']);
    }
    const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM coupon_order WHERE order_no = ?`, [orderNo])) as { n: string }[];
    expect(Number(n)).toBe(0);
    const service = (path: string, body: Record<string, unknown>) => as(serviceToken(), path, { ...body, userId: 'victim' });
    const order = { userCouponId: victim, orderNo, orderAmountCents: 20000 };
    expect((await service('/redemptions/holds', order)).status).toBe(201);
    const confirmed = await service('/redemptions', order);
    expect([confirmed.status, confirmed.body.firstUse]).toEqual([201, true]);
    const other = { userCouponId: await grab('victim'), orderNo: newKey('cancelled') };
    expect((await service('/redemptions/holds', { ...other, orderAmountCents: 20000 })).status).toBe(201);
    expect((await service('/redemptions/holds/release', other)).status).toBe(200);
    expect(await checkInvariants(t.db)).toEqual([]);
  });
});
