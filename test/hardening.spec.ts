import { createHmac } from 'node:crypto';
import { Agent, request as httpRequest, IncomingHttpHeaders, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import { gzipSync } from 'node:zlib';
import request from 'supertest';
import { healthOnAgent, sendOnAgent } from './support/early-answer.js';
import { BODY_LIMIT_BYTES } from '../src/common/json-body.js';
import { rawExchange } from './support/net.js';
import { couponBody, createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, TEST_SECRET, TestApp, testConfig, tokenFor } from './support/harness.js';

/** Issue 23: what an adversarial review found, one describe per item. */

/** A GET with raw header lines (repeats included), which supertest would merge, and a body if given (fetch sends none). */
function rawGet(
  base: string,
  path: string,
  headerLines: string[],
  body?: string,
  method: 'GET' | 'HEAD' = 'GET',
): Promise<{ status: number; headers: IncomingHttpHeaders; body: string }> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const headers: string[] = ['Host', url.host];
    for (const line of headerLines) {
      const i = line.indexOf(':');
      headers.push(line.slice(0, i).trim(), line.slice(i + 1).trim());
    }
    const req = httpRequest({ host: url.hostname, port: url.port, path, method, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

describe('hardening', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => {
    await t.close();
  });

  const grab = async (user: string, overrides: Parameters<typeof createCoupon>[1] = {}) => {
    const coupon = await createCoupon(t.url, { discount: { thresholdCents: 0, amountCents: 100 }, returnOnRefund: true, ...overrides });
    const res = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor(user)))
      .set('Idempotency-Key', newKey());
    expect(res.status).toBe(201);
    return { couponId: coupon.id, userCouponId: res.body.id as string };
  };

  describe('text limits count code points (item 1)', () => {
    // 64 "a" + VARIATION SELECTOR-16: 128 code points that class-validator's Length counted as 64.
    const selectors = (n: number) => 'a\uFE0F'.repeat(n);
    // Astral-plane characters: 2 UTF-16 units each, 1 code point, 1 character of a utf8mb4 column.
    const astral = (n: number) => '\u{1D518}'.repeat(n);
    const family = '\u{1F468}\u200D\u{1F469}\u200D\u{1F467}'; // 5 code points, 8 UTF-16 units, one glyph

    it('orderNo of 64 "a\\uFE0F" (128 code points) is 400 on redemption and refund, not a 500', async () => {
      const { userCouponId } = await grab('text-1');
      const redeem = await request(t.url)
        .post('/redemptions')
        .set(bearer(tokenFor('text-1')))
        .send({ userCouponId, orderNo: selectors(64), orderAmountCents: 1000 });
      expect([redeem.status, redeem.body.code, Object.keys(redeem.body.details?.fields ?? {})]).toEqual([
        400,
        'VALIDATION_FAILED',
        ['orderNo'],
      ]);
      const refund = await request(t.url)
        .post('/redemptions/refunds')
        .set(bearer(serviceToken()))
        .send({ userCouponId, orderNo: selectors(64), refundNo: selectors(64) });
      expect([refund.status, Object.keys(refund.body.details?.fields ?? {}).sort()]).toEqual([400, ['orderNo', 'refundNo']]);
    });

    it('64 astral-plane code points (128 UTF-16 units) are a valid orderNo and refundNo, stored whole', async () => {
      const { userCouponId } = await grab('text-2');
      const orderNo = astral(64);
      const redeem = await request(t.url)
        .post('/redemptions')
        .set(bearer(tokenFor('text-2')))
        .send({ userCouponId, orderNo, orderAmountCents: 1000 });
      expect(redeem.status).toBe(201);
      expect(redeem.body.orderNo).toBe(orderNo);
      const refund = await request(t.url)
        .post('/redemptions/refunds')
        .set(bearer(serviceToken()))
        .send({ userCouponId, orderNo, refundNo: astral(64) });
      expect(refund.status).toBe(201);
      const [row] = (await t.db.query('SELECT refund_no AS refundNo FROM refund WHERE order_no = ?', [orderNo])) as { refundNo: string }[];
      expect(row.refundNo).toBe(astral(64));
    });

    it('a coupon name is 1-200 code points: 200 emoji sequences of 5 code points are refused, 200 astral characters kept', async () => {
      const tooLong = await request(t.url)
        .post('/admin/coupons')
        .set(bearer(adminToken()))
        .send({ ...couponBody(), name: family.repeat(40) + 'x' });
      expect([tooLong.status, Object.keys(tooLong.body.details?.fields ?? {})]).toEqual([400, ['name']]);
      const selectorName = await request(t.url)
        .post('/admin/coupons')
        .set(bearer(adminToken()))
        .send({ ...couponBody(), name: selectors(101) });
      expect(selectorName.status).toBe(400);
      const coupon = await createCoupon(t.url, { name: astral(200) });
      expect(coupon.name).toBe(astral(200));
      // What shoppers see: not blank, no control characters; an emoji sequence's joiners are not controls.
      for (const name of [
        '   ',
        '\u3000',
        'a\u0007b',
        'line\nbreak',
        'tab\there',
        '\u200b\u200b',
        '\u200d \u2060',
        'photo\u202egnp.exe',
        'a\u2066b\u2069',
      ])
        expect([
          name,
          (
            await request(t.url)
              .post('/admin/coupons')
              .set(bearer(adminToken()))
              .send({ ...couponBody(), name })
          ).body.details?.fields,
        ]).toEqual([name, { name: ['name must be visible text without control characters or direction overrides'] }]);
      expect((await createCoupon(t.url, { name: `${family} 满100减10` })).name).toBe(`${family} 满100减10`);
    });

    it('void and reissue reasons are 1-255 code points, combining marks counted', async () => {
      const { couponId, userCouponId } = await grab('text-3');
      const combining = 'e\u0301'.repeat(128); // 256 code points, 128 glyphs
      const voided = await request(t.url)
        .post(`/admin/user-coupons/${userCouponId}/void`)
        .set(bearer(adminToken()))
        .send({ reason: combining });
      expect([voided.status, Object.keys(voided.body.details?.fields ?? {})]).toEqual([400, ['reason']]);
      const reissued = await request(t.url)
        .post('/admin/user-coupons/reissue')
        .set(bearer(adminToken()))
        .send({ couponId, userId: 'text-3', reason: selectors(128), fromStock: false });
      expect([reissued.status, Object.keys(reissued.body.details?.fields ?? {})]).toEqual([400, ['reason']]);
      const ok = await request(t.url)
        .post('/admin/user-coupons/reissue')
        .set(bearer(adminToken()))
        .send({ couponId, userId: 'text-3', reason: astral(255), fromStock: false });
      expect(ok.status).toBe(201);
    });

    it('a void reason of 255 astral characters (510 UTF-16 units) comes back whole from the history', async () => {
      const { userCouponId } = await grab('text-4');
      const reason = '\u{1F600}'.repeat(255);
      const voided = await request(t.url).post(`/admin/user-coupons/${userCouponId}/void`).set(bearer(adminToken())).send({ reason });
      expect(voided.status).toBe(200);
      const history = await request(t.url).get(`/admin/user-coupons/${userCouponId}/history`).set(bearer(adminToken()));
      expect(history.body.transitions.at(-1)).toMatchObject({ to: 'VOID', reason });
    });

    it('a lone surrogate ("\\ud800" in the JSON) is 400 naming the field, not stored as U+FFFD', async () => {
      const post = (path: string, json: string) =>
        request(t.url).post(path).set(bearer(adminToken())).set('Content-Type', 'application/json').send(json);
      const notText = (field: string) => ({ [field]: [`${field} must be valid Unicode text (no lone surrogate)`] });
      const couponJson = JSON.stringify({ ...couponBody(), name: 'a\ud800b' });
      expect(couponJson).toContain('"name":"a\\ud800b"');
      const coupon = await post('/admin/coupons', couponJson);
      expect([coupon.status, coupon.body.code, coupon.body.details?.fields]).toEqual([400, 'VALIDATION_FAILED', notText('name')]);
      const { userCouponId } = await grab('text-5');
      const voided = await post(`/admin/user-coupons/${userCouponId}/void`, '{"reason":"fraud \\udc00"}');
      expect([voided.status, voided.body.code, voided.body.details?.fields]).toEqual([400, 'VALIDATION_FAILED', notText('reason')]);
      const [{ status }] = (await t.db.query('SELECT status FROM user_coupon WHERE id = ?', [userCouponId])) as { status: string }[];
      expect(status).toBe('UNUSED');
    });
  });

  describe('strict parsing (item 4)', () => {
    it.each(['constructor', '__proto__', 'hasOwnProperty', 'toString', 'valueOf', 'isPrototypeOf'])(
      'a query field named %s is 400 VALIDATION_FAILED',
      async (name) => {
        const res = await request(t.url)
          .get(`/me/coupons?${name}=1`)
          .set(bearer(tokenFor('parse-1')));
        expect([res.status, res.body.code, Object.keys(res.body.details?.fields ?? {})]).toEqual([400, 'VALIDATION_FAILED', [name]]);
      },
    );

    it('a query field given twice is 400 saying so, not that its value is of the wrong type', async () => {
      const mine = await request(t.url)
        .get('/me/coupons?limit=1&limit=2')
        .set(bearer(tokenFor('parse-1')));
      expect([mine.status, mine.body.details?.fields]).toEqual([400, { limit: ['limit is given more than once'] }]);
      const list = await request(t.url).get('/coupons?limit=1&limit=1');
      expect([list.status, list.body.details?.fields]).toEqual([400, { limit: ['limit is given more than once'] }]);
    });

    it.each([
      ['constructor', '{"constructor": 1, "reason": "x"}'],
      ['hasOwnProperty', '{"reason": "x", "hasOwnProperty": 1}'],
      ['validity.toString', null],
    ])('a body field named %s is 400 VALIDATION_FAILED', async (field, text) => {
      const { userCouponId } = await grab('parse-2');
      const res = text
        ? await request(t.url)
            .post(`/admin/user-coupons/${userCouponId}/void`)
            .set(bearer(adminToken()))
            .set('content-type', 'application/json')
            .send(text)
        : await request(t.url)
            .post('/admin/coupons')
            .set(bearer(adminToken()))
            .send({
              ...couponBody(),
              validity: { type: 'RELATIVE', days: 7, toString: 'x' },
            });
      expect([res.status, res.body.code, Object.keys(res.body.details?.fields ?? {})]).toEqual([400, 'VALIDATION_FAILED', [field]]);
      const [{ status }] = (await t.db.query('SELECT status FROM user_coupon WHERE id = ?', [userCouponId])) as { status: string }[];
      expect(status).toBe('UNUSED');
    });

    it.each(['0x10', '1e2', '+5', ' 5', '5 ', '5.0', '0b11', '0o7', '', '-0'])('limit=%j is 400', async (limit) => {
      const res = await request(t.url)
        .get(`/me/coupons?limit=${encodeURIComponent(limit)}`)
        .set(bearer(tokenFor('parse-3')));
      expect([res.status, Object.keys(res.body.details?.fields ?? {})]).toEqual([400, ['limit']]);
    });

    it('a query whose %-escapes are broken or not UTF-8 is 400 naming the query, not taken as literal text', async () => {
      const coupon = await createCoupon(t.url);
      const refused = [
        request(t.url).get('/admin/coupons?q=%C3').set(bearer(adminToken())),
        request(t.url).get('/coupons?limit=%G1'),
        request(t.url)
          .get('/me/coupons?limit=1%')
          .set(bearer(tokenFor('parse-1'))),
        request(t.url)
          .post(`/admin/coupons/${coupon.id}/issuances?reason=%FF&fromStock=false`)
          .set(bearer(adminToken()))
          .set('Idempotency-Key', newKey('pct'))
          .set('Content-Type', 'text/csv')
          .send('pct-1\n'),
      ];
      for (const res of await Promise.all(refused))
        expect([res.status, res.body.code, Object.keys(res.body.details?.fields ?? {})]).toEqual([400, 'VALIDATION_FAILED', ['query']]);
      const [job] = (await t.db.query('SELECT id FROM issuance_job WHERE coupon_id = ?', [coupon.id])) as unknown[];
      expect(job).toBeUndefined();
      // Escapes that are UTF-8 text still work: a search for "%" and for "券".
      const percent = await request(t.url).get('/admin/coupons?q=%25').set(bearer(adminToken()));
      const han = await request(t.url).get('/admin/coupons?q=%E5%88%B8').set(bearer(adminToken()));
      expect([percent.status, han.status]).toEqual([200, 200]);
    });

    it('plain decimal limits still work, on user and admin lists', async () => {
      expect(
        (
          await request(t.url)
            .get('/me/coupons?limit=5')
            .set(bearer(tokenFor('parse-3')))
        ).status,
      ).toBe(200);
      expect(
        (
          await request(t.url)
            .get('/me/coupons?limit=05')
            .set(bearer(tokenFor('parse-3')))
        ).status,
      ).toBe(200);
      expect((await request(t.url).get('/admin/reconciliation/runs?limit=100').set(bearer(adminToken()))).status).toBe(200);
      expect((await request(t.url).get('/admin/reconciliation/runs?limit=1e2').set(bearer(adminToken()))).status).toBe(400);
    });

    it('a query parameter on a route that takes none is 400 naming it, and the route does nothing', async () => {
      const coupon = await createCoupon(t.url, { totalStock: 5 });
      const refused = async (req: request.Test) => {
        const res = await req;
        return [res.status, res.body.code, Object.keys(res.body.details?.fields ?? {})];
      };
      const user = bearer(tokenFor('parse-4'));
      expect(await refused(request(t.url).get(`/coupons/${coupon.id}?x=1`))).toEqual([400, 'VALIDATION_FAILED', ['x']]);
      expect(await refused(request(t.url).get('/health?verbose'))).toEqual([400, 'VALIDATION_FAILED', ['verbose']]);
      expect(
        await refused(request(t.url).post(`/coupons/${coupon.id}/grab?userId=someone-else&y=2`).set(user).set('Idempotency-Key', newKey())),
      ).toEqual([400, 'VALIDATION_FAILED', ['userId', 'y']]);
      const [{ issued }] = (await t.db.query('SELECT COUNT(*) AS issued FROM user_coupon WHERE coupon_id = ?', [coupon.id])) as {
        issued: string;
      }[];
      expect(Number(issued)).toBe(0);
      // As with a bad body, the token is checked first.
      expect(await refused(request(t.url).get(`/admin/coupons/${coupon.id}?x=1`))).toEqual([401, 'UNAUTHENTICATED', []]);
      // The control: the same routes without the parameter, and a route whose query DTO declares it.
      expect((await request(t.url).get(`/coupons/${coupon.id}`)).status).toBe(200);
      expect((await request(t.url).get('/health')).status).toBe(200);
      expect((await request(t.url).get('/coupons?limit=1')).status).toBe(200);
    });

    it('a body on a route that takes none is 400 naming its fields, and the route does nothing; an empty object is no body', async () => {
      const coupon = await createCoupon(t.url, { totalStock: 5 });
      const user = bearer(tokenFor('parse-5'));
      const grabWith = (body: string) =>
        request(t.url)
          .post(`/coupons/${coupon.id}/grab`)
          .set(user)
          .set('Idempotency-Key', newKey())
          .set('content-type', 'application/json')
          .send(body);
      const refusal = (res: request.Response) => [res.status, res.body.code, Object.keys(res.body.details?.fields ?? {})];
      expect(refusal(await grabWith('{"x": 1, "userId": "someone-else"}'))).toEqual([400, 'VALIDATION_FAILED', ['x', 'userId']]);
      expect(refusal(await grabWith('{"__proto__": {"admin": true}}'))).toEqual([400, 'VALIDATION_FAILED', ['__proto__']]);
      expect(refusal(await grabWith('[1]'))).toEqual([400, 'VALIDATION_FAILED', ['body']]);
      expect(refusal(await grabWith('"x"'))).toEqual([400, 'VALIDATION_FAILED', ['body']]);
      // Both at once: the query parameter and the body field are named together.
      const both = await request(t.url).post(`/coupons/${coupon.id}/grab?q=1`).set(user).set('Idempotency-Key', newKey()).send({ b: 1 });
      expect(refusal(both)).toEqual([400, 'VALIDATION_FAILED', ['q', 'b']]);
      const [{ issued }] = (await t.db.query('SELECT COUNT(*) AS issued FROM user_coupon WHERE coupon_id = ?', [coupon.id])) as {
        issued: string;
      }[];
      expect(Number(issued)).toBe(0);
      // The token is checked first; an empty object, or no body, is taken.
      expect(refusal(await request(t.url).delete('/admin/webhooks/1').send({ foo: 1 }))).toEqual([401, 'UNAUTHENTICATED', []]);
      expect(refusal(await request(t.url).delete('/admin/webhooks/1').set(bearer(adminToken())).send({ foo: 1 }))).toEqual([
        400,
        'VALIDATION_FAILED',
        ['foo'],
      ]);
      expect((await grabWith('{}')).status).toBe(201);
      expect(
        (
          await request(t.url)
            .post(`/coupons/${coupon.id}/grab`)
            .set(bearer(tokenFor('parse-6')))
            .set('Idempotency-Key', newKey())
        ).status,
      ).toBe(201);
    });
  });

  it('a body on a GET is 400 naming body (GET routes take none), whatever its type; without one the same GET answers', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    const auth = `Authorization: Bearer ${tokenFor('get-body')}`;
    const refusal = async (path: string, headerLines: string[], body: string) => {
      const res = await rawGet(t.url, path, [auth, ...headerLines], body);
      return [path, res.status, JSON.parse(res.body).code, Object.keys(JSON.parse(res.body).details?.fields ?? {})];
    };
    const json = 'Content-Type: application/json';
    for (const [path, headerLines, body] of [
      ['/me/coupons', [json, 'Content-Length: 7'], '{"x":1}'],
      ['/health', [json, 'Content-Length: 8'], 'not json'],
      ['/metrics', [json, 'Content-Length: 2'], '{}'],
      [`/coupons/${coupon.id}`, ['Content-Type: text/plain', 'Content-Length: 5'], 'hello'],
      [`/coupons/${coupon.id}`, [json, 'Transfer-Encoding: chunked'], '7\r\n{"x":1}\r\n0\r\n\r\n'],
    ] as const)
      expect(await refusal(path, [...headerLines], body)).toEqual([path, 400, 'VALIDATION_FAILED', ['body']]);
    expect((await rawGet(t.url, '/me/coupons', [auth])).status).toBe(200);
    expect((await rawGet(t.url, `/coupons/${coupon.id}`, [auth, 'Content-Length: 0'])).status).toBe(200);
    // A chunked body that ends before its first byte is no body, as on every other method.
    for (const path of ['/me/coupons', `/coupons/${coupon.id}`, '/coupons'])
      for (const method of ['GET', 'HEAD'] as const)
        expect([path, method, (await rawGet(t.url, path, [auth, json, 'Transfer-Encoding: chunked'], '', method)).status]).toEqual([
          path,
          method,
          200,
        ]);
  });

  it('a Content-Encoding on a GET or HEAD is ignored, memory holding the answer or not: there is no body to decode', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    const auth = `Authorization: Bearer ${tokenFor('get-encoding')}`;
    for (const path of [`/coupons/${coupon.id}`, '/coupons?limit=20', '/me/coupons']) {
      // The first may find memory empty; the second finds it filled by the first.
      const answers = [];
      for (const method of ['GET', 'GET', 'HEAD'] as const)
        answers.push((await rawGet(t.url, path, [auth, 'Content-Encoding: br'], undefined, method)).status);
      expect([path, answers]).toEqual([path, [200, 200, 200]]);
      // One sent with a body is refused for the body, as without the header.
      const withBody = await rawGet(
        t.url,
        path,
        [auth, 'Content-Encoding: gzip', 'Content-Type: application/json', 'Content-Length: 2'],
        '{}',
      );
      expect([path, withBody.status, JSON.parse(withBody.body).details?.fields]).toEqual([
        path,
        400,
        { body: ['this route takes no body'] },
      ]);
    }
  });

  it('a body over 64 KiB on a GET is 413 like on any other method, before the token is looked at; one just under it is 400', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    const auth = `Authorization: Bearer ${tokenFor('get-big-body')}`;
    // Node's client frames a GET's body only as told.
    const answer = async (path: string, headerLines: string[], size: number) => {
      const framing = headerLines.includes(chunked) ? [] : [`Content-Length: ${size}`];
      const body = JSON.stringify({ pad: 'x'.repeat(size - 10) });
      const res = await rawGet(t.url, path, ['Content-Type: application/json', ...framing, ...headerLines], body);
      return [path, headerLines.join(' '), res.status, JSON.parse(res.body).code];
    };
    const chunked = 'Transfer-Encoding: chunked';
    for (const path of ['/me/coupons', `/coupons/${coupon.id}`, '/coupons', '/admin/coupons', '/health'])
      for (const headerLines of [[auth], [], [auth, chunked]]) {
        const lines = headerLines.join(' ');
        expect(await answer(path, headerLines, 64 * 1024 + 1)).toEqual([path, lines, 413, 'PAYLOAD_TOO_LARGE']);
        expect((await answer(path, headerLines, 64 * 1024))[2]).not.toBe(413);
      }
    // The connection that carried a refused body still answers.
    expect((await rawGet(t.url, '/me/coupons', [auth])).status).toBe(200);
  });

  describe('times', () => {
    it('a time without its zone is 400 naming it; one with an offset is the instant it names', async () => {
      const create = (overrides: Record<string, unknown>) =>
        request(t.url)
          .post('/admin/coupons')
          .set(bearer(adminToken()))
          .send({ ...couponBody(), ...overrides });
      const fields = (res: request.Response) => [res.status, Object.keys(res.body.details?.fields ?? {})];
      expect(fields(await create({ grabStartAt: '2026-01-01T00:00:00' }))).toEqual([400, ['grabStartAt']]);
      expect(fields(await create({ grabEndAt: '2099-01-01' }))).toEqual([400, ['grabEndAt']]);
      expect(
        fields(await create({ validity: { type: 'FIXED', startAt: '2026-01-01T00:00:00.000', endAt: '2099-01-01T00:00:00Z' } })),
      ).toEqual([400, ['validity.startAt']]);
      const offset = await create({ grabStartAt: '2026-01-01T08:00:00+08:00' });
      expect([offset.status, offset.body.grabStartAt]).toEqual([201, '2026-01-01T00:00:00.000Z']);
    });
  });

  describe('body parsing', () => {
    it('a body field named __proto__ or constructor is 400 naming it, at any depth, and writes nothing', async () => {
      const { userCouponId } = await grab('parse-7');
      const send = (path: string, text: string, token = serviceToken()) =>
        request(t.url).post(path).set(bearer(token)).set('content-type', 'application/json').send(text);
      const fields = (res: request.Response) => [res.status, res.body.code, Object.keys(res.body.details?.fields ?? {})];
      const redemption = `"userCouponId": "${userCouponId}", "orderNo": "proto-1", "orderAmountCents": 5000, "userId": "parse-7"`;
      expect(fields(await send('/redemptions', `{${redemption}, "__proto__": {"x": 1}}`))).toEqual([
        400,
        'VALIDATION_FAILED',
        ['__proto__'],
      ]);
      expect(fields(await send('/redemptions', `{${redemption}, "constructor": {"prototype": {"x": 1}}}`))).toEqual([
        400,
        'VALIDATION_FAILED',
        ['constructor'],
      ]);
      const nested = JSON.stringify(couponBody()).replace('"validity":{', '"validity":{"__proto__":{"admin":true},');
      expect(fields(await send('/admin/coupons', nested, adminToken()))).toEqual([400, 'VALIDATION_FAILED', ['validity.__proto__']]);
      const [{ status }] = (await t.db.query('SELECT status FROM user_coupon WHERE id = ?', [userCouponId])) as { status: string }[];
      expect(status).toBe('UNUSED');
    });

    it.each([
      ['text/plain', 'hello'],
      ['application/x-www-form-urlencoded', 'userCouponId=1&orderNo=x'],
    ])('a %s body is 415 UNSUPPORTED_MEDIA_TYPE, on routes with and without a body', async (type, text) => {
      for (const [path, token] of [
        ['/redemptions', serviceToken()],
        ['/admin/reconciliation/runs', adminToken()],
      ])
        expect((await request(t.url).post(path).set(bearer(token)).set('content-type', type).send(text)).body.code).toBe(
          'UNSUPPORTED_MEDIA_TYPE',
        );
    });
  });

  it('an empty body is no body whatever its Content-Type: a grab goes through, a route that needs a body says so; a non-empty one is 415 naming its type', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10, perUserLimit: 10 });
    const user = bearer(tokenFor('empty-body-user'));
    for (const type of ['text/plain;charset=UTF-8', 'application/x-www-form-urlencoded', 'application/octet-stream']) {
      const grab = await request(t.url)
        .post(`/coupons/${coupon.id}/grab`)
        .set(user)
        .set('Idempotency-Key', newKey())
        .set('Content-Type', type)
        .send('');
      expect([type, grab.status, grab.body.couponId]).toEqual([type, 201, coupon.id]);
      const redeem = await request(t.url).post('/redemptions').set(bearer(serviceToken())).set('Content-Type', type).send('');
      expect([type, redeem.status, redeem.body.details?.fields]).toEqual([type, 400, { body: ['a JSON object body is required'] }]);
      // Without a length: a chunked body whose first chunk is the last.
      const agent = new Agent({ keepAlive: true, maxSockets: 1 });
      try {
        const headers = { ...user, 'Idempotency-Key': newKey(), 'Content-Type': type };
        const chunked = await sendOnAgent(agent, 'POST', `${t.url}/coupons/${coupon.id}/grab`, headers, '', true);
        expect([type, chunked.status]).toEqual([type, 201]);
        const refused = await sendOnAgent(
          agent,
          'POST',
          `${t.url}/coupons/${coupon.id}/grab`,
          { ...headers, 'Idempotency-Key': newKey() },
          'x',
          true,
        );
        expect([type, refused.status, refused.connection]).toEqual([type, 415, 'keep-alive']);
        expect((await healthOnAgent(agent, t.url)).status).toBe(200);
      } finally {
        agent.destroy();
      }
    }
    const jsonAgent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const headers = { ...user, 'Idempotency-Key': newKey(), 'Content-Type': 'application/json' };
      expect((await sendOnAgent(jsonAgent, 'POST', `${t.url}/coupons/${coupon.id}/grab`, headers, '', true)).status).toBe(201);
    } finally {
      jsonAgent.destroy();
    }
    const plain = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(user)
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'text/plain')
      .send('x');
    const unknownRoute = await request(t.url).post('/admin/coupns').set(bearer(adminToken())).type('form').send('x=1');
    expect([unknownRoute.status, unknownRoute.body.code]).toEqual([404, 'NOT_FOUND']);
    expect([plain.status, plain.body.code, plain.body.message]).toEqual([
      415,
      'UNSUPPORTED_MEDIA_TYPE',
      'Content-Type text/plain is not accepted on this route',
    ]);
  });

  it('a body refused before its end (413 over the limit, 415 of another type or compressed) is read and dropped, with a length or chunked: the client still sending gets the answer, and the connection the next request', async () => {
    const coupon = await createCoupon(t.url);
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const big = JSON.stringify({ pad: 'x'.repeat(4 * 1024 * 1024) });
    const json = { 'Content-Type': 'application/json' };
    try {
      for (const [path, headers, code] of [
        ['/admin/coupons', { ...bearer(adminToken()), ...json }, 'PAYLOAD_TOO_LARGE'],
        ['/redemptions', { ...bearer(serviceToken()), ...json }, 'PAYLOAD_TOO_LARGE'],
        [`/coupons/${coupon.id}/grab`, { ...bearer(tokenFor('early-1')), ...json, 'Idempotency-Key': newKey() }, 'PAYLOAD_TOO_LARGE'],
        ['/redemptions', { ...bearer(serviceToken()), 'Content-Type': 'text/plain' }, 'UNSUPPORTED_MEDIA_TYPE'],
        ['/admin/coupons', { ...bearer(adminToken()), ...json, 'Content-Encoding': 'gzip' }, 'UNSUPPORTED_MEDIA_TYPE'],
      ] as const)
        for (const chunked of [false, true]) {
          const refused = await sendOnAgent(agent, 'POST', `${t.url}${path}`, headers, big, chunked);
          const answer = [
            path,
            chunked,
            refused.status,
            (JSON.parse(refused.body) as { code: string }).code,
            refused.connection,
            refused.sentAll,
          ];
          expect(answer).toEqual([path, chunked, code === 'PAYLOAD_TOO_LARGE' ? 413 : 415, code, 'keep-alive', true]);
          const next = await healthOnAgent(agent, t.url);
          expect([next.status, next.socket === refused.socket]).toEqual([200, true]);
        }
    } finally {
      agent.destroy();
    }
  }, 30_000);

  it('a body refused before its end on a connection the client asked to close: the rest is read before the close, so the client sends it all and keeps the answer', async () => {
    const { port } = new URL(t.url);
    const total = 4 * 1024 * 1024;
    for (const [version, connection] of [
      ['1.1', 'Connection: close\r\n'],
      ['1.0', ''],
    ]) {
      const socket = connect(Number(port), '127.0.0.1');
      const received: Buffer[] = [];
      let failed: Error | null = null;
      socket.on('data', (b: Buffer) => received.push(b)).on('error', (err) => (failed = err));
      const ended = new Promise((r) => socket.once('close', r));
      const write = (data: string | Buffer) => new Promise<void>((r) => socket.write(data, () => r()));
      await write(
        `POST /admin/coupons HTTP/${version}\r\nHost: x\r\nAuthorization: Bearer ${adminToken()}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${total}\r\n${connection}\r\n`,
      );
      const chunk = Buffer.alloc(64 * 1024, 'x');
      await write(chunk);
      // The answer comes before the rest is sent; the rest then goes to a server that has answered.
      for (let i = 0; i < 100 && received.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
      for (let sent = chunk.length; sent < total && !failed; sent += chunk.length) await write(chunk);
      socket.end();
      await ended;
      const answer = Buffer.concat(received).toString();
      expect([version, answer.slice(0, 12), /\r\nconnection: close\r\n/i.test(answer), failed]).toEqual([
        version,
        'HTTP/1.1 413',
        true,
        null,
      ]);
    }
  }, 30_000);

  it('a connection kept alive through many answers sent as they arrive (the coupon page from memory, an unknown route, a refused body) gathers no listener per request', async () => {
    const coupon = await createCoupon(t.url);
    const server = t.app.getHttpServer() as Server;
    const sockets: Socket[] = [];
    const opened = (s: Socket) => sockets.push(s);
    server.on('connection', opened);
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const get = (path: string) =>
      new Promise<number>((resolve, reject) => {
        const req = httpRequest(`${t.url}${path}`, { agent }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        });
        req.on('error', reject);
        req.end();
      });
    const refused = async () =>
      (
        await sendOnAgent(
          agent,
          'POST',
          `${t.url}/redemptions`,
          { ...bearer(serviceToken()), 'Content-Type': 'text/plain' },
          'x'.repeat(1024 * 1024),
          false,
        )
      ).status;
    const listenersAfter = async (rounds: number) => {
      for (let i = 0; i < rounds; i++)
        expect([await get(`/coupons/${coupon.id}`), await get('/nope'), await refused()]).toEqual([200, 404, 415]);
      return sockets.map((s) => s.listenerCount('close'));
    };
    try {
      const early = await listenersAfter(2);
      expect(await listenersAfter(20)).toEqual(early);
      expect(sockets).toHaveLength(1);
    } finally {
      agent.destroy();
      server.off('connection', opened);
    }
  });

  it('a compressed body (Content-Encoding gzip) is 415 UNSUPPORTED_MEDIA_TYPE, JSON or CSV; identity is taken', async () => {
    const coupon = await createCoupon(t.url);
    const post = (type: string, encoding: string, body: Buffer | string) =>
      request(t.url)
        .post(`/admin/coupons/${coupon.id}/issuances${type === 'text/csv' ? '?reason=r&fromStock=false' : ''}`)
        .set(bearer(adminToken()))
        .set('Idempotency-Key', newKey('gz'))
        .set('Content-Type', type)
        .set('Content-Encoding', encoding)
        .send(body);
    const json = Buffer.from(JSON.stringify({ userIds: ['gz-1'], reason: 'r', fromStock: false }));
    expect((await post('application/json', 'gzip', gzipSync(json))).body.code).toBe('UNSUPPORTED_MEDIA_TYPE');
    expect((await post('text/csv', 'gzip', gzipSync(Buffer.from('gz-2\n')))).body.code).toBe('UNSUPPORTED_MEDIA_TYPE');
    expect((await post('application/json', 'identity', json.toString())).status).toBe(202);
  });

  it('a JSON body that names a field twice is 400 naming it (escaped or not, at any depth), and nothing is written; a name in two objects is no repeat', async () => {
    const { userCouponId } = await grab('twice');
    const redeem = (body: string) =>
      request(t.url).post('/redemptions').set(bearer(serviceToken())).set('Content-Type', 'application/json').send(body);
    const fields = `"userCouponId":"${userCouponId}","orderAmountCents":20000,"userId":"twice"`;
    const refused = (field: string) => [400, 'VALIDATION_FAILED', { fields: { [field]: [`${field} is given more than once`] } }];
    // JSON.parse keeps the last: the coupon was used on the order the client did not mean.
    for (const body of [`{${fields},"orderNo":"tw-1","orderNo":"tw-2"}`, `{${fields},"orderNo":"tw-1","\\u006frderNo":"tw-2"}`]) {
      const res = await redeem(body);
      expect([res.status, res.body.code, res.body.details]).toEqual(refused('orderNo'));
    }
    // Found before a part nested too deep for the scan (it recurses): still named.
    const deep = await redeem(`{${fields},"orderNo":"tw-1","orderNo":"tw-2","x":${'['.repeat(30_000)}${']'.repeat(30_000)}}`);
    expect([deep.status, deep.body.code, deep.body.details]).toEqual(refused('orderNo'));
    expect(await t.db.query(`SELECT id FROM redemption WHERE order_no IN ('tw-1', 'tw-2')`)).toEqual([]);
    const used = await redeem(`{${fields},"orderNo":"tw-3"}`);
    expect([used.status, used.body.orderNo]).toEqual([201, 'tw-3']);
    const create = (text: string) =>
      request(t.url)
        .post('/admin/coupons')
        .set(bearer(adminToken()))
        .set('Idempotency-Key', newKey('tw'))
        .set('Content-Type', 'application/json')
        .send(text);
    const body = JSON.stringify(
      couponBody({ validity: { type: 'RELATIVE', days: 7 }, discount: { type: 'AMOUNT', thresholdCents: 10000, amountCents: 1000 } }),
    );
    const nested = await create(body.replace('"days":7', '"days":7,"days":30'));
    expect([nested.status, nested.body.code, nested.body.details]).toEqual(refused('validity.days'));
    // `type` in validity and in discount is two names, each said once in its object.
    expect((await create(body)).status).toBe(201);
  });

  it('a JSON body labelled with a charset other than UTF-8 is 415 UNSUPPORTED_MEDIA_TYPE, not read as UTF-8 whatever it is', async () => {
    const coupon = await createCoupon(t.url);
    const post = (type: string) =>
      request(t.url)
        .post(`/admin/coupons/${coupon.id}/issuances`)
        .set(bearer(adminToken()))
        .set('Idempotency-Key', newKey('cs'))
        .set('Content-Type', type)
        .send(JSON.stringify({ userIds: ['cs-1'], reason: 'r', fromStock: false }));
    const answers: [string, number, string | undefined][] = [];
    for (const type of ['application/json; charset=latin1', 'application/json;charset="utf-16"', 'application/json; CHARSET=ISO-8859-1'])
      answers.push([type, (await post(type)).status, (await post(type)).body.code]);
    expect(answers).toEqual(answers.map(([type]) => [type, 415, 'UNSUPPORTED_MEDIA_TYPE']));
    for (const type of [
      'application/json',
      'application/json; charset=utf-8',
      'application/json; charset="UTF-8"',
      'application/json; charset=utf8',
    ])
      expect([type, (await post(type)).status]).toEqual([type, 202]);
    // An empty body is no body whatever it is labelled, by its length or chunked.
    const grab = (framing: string) =>
      rawExchange(
        t.url,
        `POST /coupons/${coupon.id}/grab HTTP/1.1\r\nHost: x\r\nAuthorization: ${bearer(tokenFor(`cs-${framing.length}`)).Authorization}\r\n` +
          `Idempotency-Key: ${newKey()}\r\nContent-Type: application/json; charset=latin1\r\n${framing}Connection: close\r\n\r\n` +
          (framing.startsWith('Transfer') ? '0\r\n\r\n' : ''),
      );
    for (const framing of ['Content-Length: 0\r\n', 'Transfer-Encoding: chunked\r\n'])
      expect([framing, (await grab(framing)).split(' ')[1]]).toEqual([framing, '201']);
  });

  describe('request ids (item 5)', () => {
    const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
    const idOf = async (sent: string | undefined, path = '/coupons/1') => {
      const req = request(t.url).get(path);
      if (sent !== undefined) void req.set('X-Request-Id', sent);
      return (await req).headers['x-request-id'] as string;
    };

    it.each(['abc', 'A-Z.a_z:0-9', 'x'.repeat(128), 'trace:4bf92f3577b34da6a3ce929d0e0e4736'])(
      'a client id %j is kept and echoed',
      async (id) => {
        expect(await idOf(id)).toBe(id);
      },
    );

    it.each([
      ['<script>', '<script>alert(1)</script>'],
      ['8 KB', 'a'.repeat(8192)],
      ['129 characters', 'x'.repeat(129)],
      ['a space', 'a b'],
      ['a slash', 'a/b'],
      ['latin-1', 'caf\u00e9'],
      ['empty', ''],
    ])('a client id with %s is replaced by a generated one', async (_, id) => {
      const echoed = await idOf(id);
      expect(echoed).toMatch(UUID);
    });

    it('every answer carries one: no header, an error, an unknown route, two headers', async () => {
      expect(await idOf(undefined)).toMatch(UUID);
      expect(await idOf(undefined, '/no/such/route')).toMatch(UUID);
      const unauthenticated = await request(t.url).get('/me/coupons').set('X-Request-Id', 'req-401');
      expect([unauthenticated.status, unauthenticated.headers['x-request-id']]).toEqual([401, 'req-401']);
      const twice = await rawGet(t.url, '/coupons/1', ['X-Request-Id: one', 'X-Request-Id: two']);
      expect(twice.headers['x-request-id']).toMatch(UUID);
      // Too broken to reach the router (a header line without a colon): answered on the socket, still with an id.
      const raw = await rawExchange(t.url, 'GET /coupons/1 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n');
      expect(raw).toMatch(/^HTTP\/1\.1 400 /);
      expect(raw).toMatch(/\r\nX-Request-Id: [0-9a-f-]{36}\r\n/);
    });

    it('an HTTP/1.1 request without Host is 400 VALIDATION_FAILED in the error format, not a bare 400', async () => {
      const raw = await rawExchange(t.url, 'GET /health HTTP/1.1\r\nConnection: close\r\n\r\n');
      expect(raw).toMatch(/^HTTP\/1\.1 400 /);
      expect(raw).toMatch(/\r\nx-request-id: [0-9a-f-]{36}\r\n/i);
      const body = JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)) as { code: string; details: { fields: Record<string, unknown> } };
      expect([body.code, Object.keys(body.details.fields)]).toEqual(['VALIDATION_FAILED', ['host']]);
      // HTTP/1.0 has no Host requirement.
      expect(await rawExchange(t.url, 'GET /health HTTP/1.0\r\n\r\n')).toMatch(/^HTTP\/1\.1 200 /);
    });

    it('two Host lines or a Host that is no host are 400 VALIDATION_FAILED (RFC 9112 3.2), on every way a request is answered', async () => {
      const coupon = await createCoupon(t.url);
      const grab = `POST /coupons/${coupon.id}/grab HTTP/1.1\r\nAuthorization: ${bearer(tokenFor('host-1')).Authorization}\r\nIdempotency-Key: ${newKey()}\r\n`;
      const answers: [string, string, string | undefined][] = [];
      for (const head of [`GET /coupons/${coupon.id} HTTP/1.1\r\n`, 'GET /health HTTP/1.1\r\n', grab]) {
        for (const hosts of ['Host: a\r\nHost: b\r\n', 'Host: a b\r\n', 'Host: a/b\r\n', 'Host: x\r\nhost: x\r\n']) {
          const raw = await rawExchange(t.url, `${head}${hosts}Connection: close\r\n\r\n`);
          const body = JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)) as {
            code: string;
            details?: { fields: Record<string, unknown> };
          };
          answers.push([raw.split(' ')[1], body.code, Object.keys(body.details?.fields ?? {})[0]]);
        }
      }
      expect(answers).toEqual(Array.from({ length: 12 }, () => ['400', 'VALIDATION_FAILED', 'host']));
      // Hosts as clients send them: a name, an address, an IPv6 literal, each with or without a port.
      for (const host of ['localhost', 'api.example.com:8443', '127.0.0.1:3000', '[::1]:3000', '[::1]']) {
        const raw = await rawExchange(t.url, `GET /coupons/${coupon.id} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
        expect([host, raw.split(' ')[1]]).toEqual([host, '200']);
      }
    });

    it('CONNECT is 404 in the error format with the request id, not a connection closed unanswered', async () => {
      for (const target of ['/coupons', '127.0.0.1:3306']) {
        const raw = await rawExchange(t.url, `CONNECT ${target} HTTP/1.1\r\nHost: x\r\nX-Request-Id: probe-connect\r\n\r\n`);
        expect([target, raw.split('\r\n')[0]]).toEqual([target, 'HTTP/1.1 404 Not Found']);
        expect(raw).toMatch(/\r\nX-Request-Id: probe-connect\r\n/);
        expect(JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4))).toEqual({ code: 'NOT_FOUND', message: 'Route not found' });
      }
      // Clients resetting the connection right after the request: the server stays up.
      for (let i = 0; i < 200; i++) {
        const socket = connect(Number(new URL(t.url).port), '127.0.0.1');
        socket.on('error', () => undefined);
        await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
        socket.write('CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\nsome bytes');
        socket.resetAndDestroy();
      }
      expect((await request(t.url).get('/health')).status).toBe(200);
    });

    it('an Expect other than 100-continue is ignored (RFC 9110 allows it): the request is answered as without it, not a bare 417', async () => {
      // Node's client sends its headers at once when told to expect: written by hand instead.
      const raw = await rawExchange(
        t.url,
        `POST /redemptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${serviceToken()}\r\nExpect: foo\r\nX-Request-Id: probe-expect\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
      );
      expect(raw.split('\r\n')[0]).toBe('HTTP/1.1 400 Bad Request');
      expect(raw).toMatch(/\r\nx-request-id: probe-expect\r\n/i);
      expect((JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)) as { code: string }).code).toBe('VALIDATION_FAILED');
    });

    /**
     * Sends `head`, and `body` once the server says 100 Continue, as a client that expects does (or at
     * once, as one that does not wait); reads until the server closes or 2 s pass.
     */
    const expectingContinue = (head: string, body: string | Buffer, waits = true) =>
      new Promise<{ answer: string; bodySent: boolean; closedByServer: boolean }>((resolve, reject) => {
        const socket = connect(Number(new URL(t.url).port), '127.0.0.1', () => {
          socket.write(head);
          if (!waits) socket.write(body);
        });
        let answer = '';
        let bodySent = !waits;
        const finish = (closedByServer: boolean) => {
          clearTimeout(timer);
          socket.destroy();
          resolve({ answer, bodySent, closedByServer });
        };
        const timer = setTimeout(() => finish(false), 2000);
        socket.on('data', (c: Buffer) => {
          answer += c.toString();
          if (!bodySent && answer.startsWith('HTTP/1.1 100 Continue\r\n\r\n')) {
            bodySent = true;
            socket.write(body);
          }
        });
        socket.on('close', () => finish(true));
        socket.on('error', reject);
      });
    const codeOf = (answer: string) =>
      (JSON.parse(answer.slice(answer.indexOf('\r\n\r\n', answer.lastIndexOf('HTTP/1.1')) + 4)) as { code: string }).code;
    const tooLarge = `POST /admin/coupons HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${adminToken()}\r\nContent-Type: application/json\r\nContent-Length: ${4 * 1024 * 1024}\r\nExpect: 100-continue\r\n\r\n`;

    it('Expect: 100-continue: a request refused on its headers is answered without asking for the body, and the connection closes', async () => {
      const refusals: [string, string, string][] = [
        // Too large by its length.
        [tooLarge, 'HTTP/1.1 413 Payload Too Large', 'PAYLOAD_TOO_LARGE'],
        // A bulk upload (CSV) without a token: its megabytes are not sent to be told 401.
        [
          `POST /admin/coupons/1/issuances HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\nContent-Length: 5000000\r\nExpect: 100-continue\r\n\r\n`,
          'HTTP/1.1 401 Unauthorized',
          'UNAUTHENTICATED',
        ],
      ];
      for (const [head, status, code] of refusals) {
        const { answer, bodySent, closedByServer } = await expectingContinue(head, 'x'.repeat(BODY_LIMIT_BYTES + 1));
        expect([answer.split('\r\n')[0], bodySent, closedByServer]).toEqual([status, false, true]);
        expect(answer).toMatch(/\r\nconnection: close\r\n/i);
        expect(codeOf(answer)).toBe(code);
      }
      expect((await request(t.url).get('/health')).status).toBe(200);
    });

    it('Expect: 100-continue: a client that sends its body without waiting still reads its 413, not a reset', async () => {
      // The rest of the body is read and dropped while the connection closes, as without Expect.
      for (let i = 0; i < 3; i++) {
        const { answer } = await expectingContinue(tooLarge, Buffer.alloc(4 * 1024 * 1024, 'x'), false);
        expect([answer.split('\r\n')[0], codeOf(answer)]).toEqual(['HTTP/1.1 413 Payload Too Large', 'PAYLOAD_TOO_LARGE']);
      }
    });

    it('Expect: 100-continue: a body the route reads is asked for with 100 Continue, then answered on the same connection', async () => {
      const { answer, bodySent } = await expectingContinue(
        `POST /redemptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${serviceToken()}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n`,
        '{}',
      );
      expect(bodySent).toBe(true);
      const final = answer.slice('HTTP/1.1 100 Continue\r\n\r\n'.length);
      expect(final.split('\r\n')[0]).toBe('HTTP/1.1 400 Bad Request');
      expect(final).toMatch(/\r\nconnection: keep-alive\r\n/i);
      expect(codeOf(final)).toBe('VALIDATION_FAILED');
    });

    it('Expect: 100-continue: a CSV sent whole with its head, read after the database work, is taken and its connection kept', async () => {
      const coupon = await createCoupon(t.url);
      const csv = 'whole-1\nwhole-2\n';
      const { answer, closedByServer } = await expectingContinue(
        `POST /admin/coupons/${coupon.id}/issuances?reason=whole&fromStock=false HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${adminToken()}\r\nIdempotency-Key: ${newKey('whole')}\r\nContent-Type: text/csv\r\nContent-Length: ${csv.length}\r\nExpect: 100-continue\r\n\r\n`,
        csv,
        false,
      );
      const final = answer.slice(answer.lastIndexOf('HTTP/1.1'));
      expect([final.split('\r\n')[0], closedByServer]).toEqual(['HTTP/1.1 202 Accepted', false]);
      expect(final).toMatch(/\r\nconnection: keep-alive\r\n/i);
    });
  });

  describe('token rules (item 6)', () => {
    const handSigned = (payload: Record<string, unknown>) => {
      const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
      const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(payload)}`;
      return `${input}.${createHmac('sha256', TEST_SECRET).update(input).digest('base64url')}`;
    };
    const now = () => Math.floor(Date.now() / 1000);
    const status = async (token: string) => {
      const res = await request(t.url).get('/me/coupons').set(bearer(token));
      return [res.status, res.body.code];
    };

    it('a well-formed token is accepted (the control)', async () => {
      expect(await status(handSigned({ sub: 'tok-1', exp: now() + 3600, iat: now() }))).toEqual([200, undefined]);
    });

    it('a JWT whose signature is spelt in base64 (+ / =) is 401, though the bearer syntax now lets it through', async () => {
      let token = '';
      // The same signature bytes in the other alphabet: only a signature with - or _ is spelt differently.
      for (let n = 0; !/[-_]/.test(token.split('.')[2] ?? ''); n++) token = handSigned({ sub: 'tok-1', exp: now() + 3600, n });
      const [header, payload, signature] = token.split('.');
      const base64 = Buffer.from(signature, 'base64url').toString('base64');
      expect(base64).toMatch(/[+/].*=$/);
      expect(await status(token)).toEqual([200, undefined]);
      expect(await status(`${header}.${payload}.${base64}`)).toEqual([401, 'UNAUTHENTICATED']);
    });

    it.each([
      ['exp 1e300', { exp: 1e300 }],
      ['exp 32 days ahead', { exp: now() + 32 * 86_400 }],
      ['iat 2 minutes ahead', { exp: now() + 3600, iat: now() + 120 }],
      ['nbf 2 minutes ahead', { exp: now() + 3600, nbf: now() + 120 }],
    ])('%s is 401 UNAUTHENTICATED', async (_, claims) => {
      expect(await status(handSigned({ sub: 'tok-1', ...claims }))).toEqual([401, 'UNAUTHENTICATED']);
    });

    it('two Authorization headers are 401, even when both carry the same valid token', async () => {
      const token = handSigned({ sub: 'tok-1', exp: now() + 3600 });
      const once = await rawGet(t.url, '/me/coupons', [`Authorization: Bearer ${token}`]);
      expect(once.status).toBe(200);
      for (const second of [`Bearer ${token}`, 'Bearer x', '']) {
        const twice = await rawGet(t.url, '/me/coupons', [`Authorization: Bearer ${token}`, `authorization: ${second}`]);
        expect([twice.status, (JSON.parse(twice.body) as { code: string }).code]).toEqual([401, 'UNAUTHENTICATED']);
      }
    });

    it('JWT_MAX_TTL_SECONDS is validated at boot and sets the limit', async () => {
      expect(() => testConfig({ JWT_MAX_TTL_SECONDS: '0' })).toThrow(/JWT_MAX_TTL_SECONDS/);
      expect(() => testConfig({ JWT_MAX_TTL_SECONDS: 'forever' })).toThrow(/JWT_MAX_TTL_SECONDS/);
      expect(testConfig().JWT_MAX_TTL_SECONDS).toBe(31 * 86_400);
      expect(testConfig({ JWT_MAX_TTL_SECONDS: '600' }).JWT_MAX_TTL_SECONDS).toBe(600);
    });
  });

  describe('exposure (item 7)', () => {
    const METRICS_TOKEN = 'metrics-token-0123456789';
    let locked: TestApp;
    beforeAll(async () => {
      locked = await startTestApp({ METRICS_TOKEN, DOCS_ENABLED: 'false' });
    });
    afterAll(async () => {
      await locked.close();
    });

    it('without METRICS_TOKEN /metrics is open, and /docs and /docs-json are served by default', async () => {
      expect((await request(t.url).get('/metrics')).status).toBe(200);
      expect((await request(t.url).get('/docs-json')).status).toBe(200);
      expect((await request(t.url).get('/docs')).status).toBe(200);
    });

    it('answers a docs asset path with dot or empty segments 404 NOT_FOUND: no such file, not a missing role (403)', async () => {
      for (const path of [
        '/docs//swagger-ui.css',
        '/docs/./swagger-ui.css',
        '/docs/a/../swagger-ui.css',
        '/docs/%2e%2e/coupons',
        '/docs/..',
      ]) {
        const res = await request(t.url).get(path);
        expect([path, res.status, res.body.code]).toEqual([path, 404, 'NOT_FOUND']);
      }
      expect((await request(t.url).get('/docs/swagger-ui.css')).status).toBe(200);
    });

    it('with METRICS_TOKEN /metrics needs it as a bearer token, else 401 in the error format', async () => {
      for (const auth of [
        undefined,
        'Bearer wrong-token-0123456789',
        `Bearer ${METRICS_TOKEN}x`,
        METRICS_TOKEN,
        `Bearer ${adminToken()}`,
      ]) {
        const req = request(locked.url).get('/metrics');
        if (auth !== undefined) void req.set('Authorization', auth);
        const res = await req;
        expect([auth, res.status, res.body.code]).toEqual([auth, 401, 'UNAUTHENTICATED']);
      }
      const twice = await rawGet(locked.url, '/metrics', [
        `Authorization: Bearer ${METRICS_TOKEN}`,
        `Authorization: Bearer ${METRICS_TOKEN}`,
      ]);
      expect(twice.status).toBe(401);
      const ok = await request(locked.url).get('/metrics').set('Authorization', `Bearer ${METRICS_TOKEN}`);
      expect([ok.status, ok.text]).toEqual([200, expect.stringContaining('# TYPE')]);
    });

    it('a METRICS_TOKEN with + / ~ and = padding (RFC 6750 b64token) is read whole from the header', async () => {
      const token = 'a+b/c~d-e.f_g0123456789==';
      const app = await startTestApp({ METRICS_TOKEN: token });
      try {
        const ok = await request(app.url).get('/metrics').set('Authorization', `Bearer ${token}`);
        expect([ok.status, ok.text]).toEqual([200, expect.stringContaining('# TYPE')]);
        const wrong = await request(app.url)
          .get('/metrics')
          .set('Authorization', `Bearer ${token.replace('+', '-')}`);
        expect(wrong.status).toBe(401);
      } finally {
        await app.close();
      }
    });

    it('DOCS_ENABLED=false: /docs and /docs-json are 404 NOT_FOUND, the API still serves', async () => {
      for (const path of ['/docs', '/docs-json']) {
        const res = await request(locked.url).get(path);
        expect([path, res.status, res.body.code]).toEqual([path, 404, 'NOT_FOUND']);
      }
      expect((await request(locked.url).get('/health')).status).toBe(200);
    });

    it('HOST, METRICS_TOKEN and DOCS_ENABLED are validated at boot', () => {
      expect(testConfig().HOST).toBe('0.0.0.0');
      for (const host of ['127.0.0.1', '::', '::1', 'localhost', 'api.internal']) expect(testConfig({ HOST: host }).HOST).toBe(host);
      for (const host of ['', 'not a host', '0.0.0.0:3000', 'http://x']) expect(() => testConfig({ HOST: host })).toThrow(/HOST/);
      expect(() => testConfig({ METRICS_TOKEN: 'short' })).toThrow(/METRICS_TOKEN/);
      expect(() => testConfig({ METRICS_TOKEN: 'has spaces in it 0123456789' })).toThrow(/METRICS_TOKEN/);
      // Only at the end, as in a bearer token: one with `=` inside could never be presented.
      expect(() => testConfig({ METRICS_TOKEN: 'metrics=token-0123456789' })).toThrow(/METRICS_TOKEN/);
      expect(testConfig({ METRICS_TOKEN: 'metrics+token/0123456789==' }).METRICS_TOKEN).toBe('metrics+token/0123456789==');
      expect(() => testConfig({ DOCS_ENABLED: 'maybe' })).toThrow(/DOCS_ENABLED/);
      expect(testConfig({ DOCS_ENABLED: 'false' }).DOCS_ENABLED).toBe(false);
      expect(testConfig().DOCS_ENABLED).toBe(true);
    });
  });
});
