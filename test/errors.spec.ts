import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import request from 'supertest';
import { AppError, ERROR_STATUS } from '../src/common/errors.js';
import { loadConfig } from '../src/config/app-config.js';
import { couponBody, createCoupon, grabRequest, newKey } from './support/factories.js';
import { adminToken, bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';

describe('error format and input limits', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  const post = (body: string, type = 'application/json') =>
    request(t.url).post('/admin/coupons').set(bearer(adminToken())).set('Content-Type', type).send(body);

  it.each([
    ['malformed JSON', '{"name": ', 400, 'VALIDATION_FAILED'],
    ['an empty JSON body', '', 400, 'VALIDATION_FAILED'],
    ['a JSON array', '[1,2,3]', 400, 'VALIDATION_FAILED'],
    ['a JSON string', '"coupon"', 400, 'VALIDATION_FAILED'],
    ['null', 'null', 400, 'VALIDATION_FAILED'],
    ['a huge number', '{"name":"x","totalStock":1e400}', 400, 'VALIDATION_FAILED'],
    ['unicode junk', '{"name":"\u0000\ud83d\ude00","totalStock":"☃"}', 400, 'VALIDATION_FAILED'],
    ['a prototype-pollution key', '{"__proto__":{"admin":true},"constructor":{"prototype":{}}}', 400, 'VALIDATION_FAILED'],
  ])('answers %s with %i %s', async (_label, body, status, code) => {
    const res = await post(body);
    expect(res.status).toBe(status);
    expect(res.body).toEqual({ code, message: expect.any(String), ...(res.body.details ? { details: expect.any(Object) } : {}) });
  });

  it.each([
    [
      '/admin/user-coupons/reissue',
      { couponId: '1', userId: 'bob', reason: 'r', fromStock: false, replacesUserCouponId: null },
      'replacesUserCouponId',
    ],
    ['/admin/reconciliation/runs', { mode: null }, 'mode'],
    ['/redemptions', { userCouponId: '1', orderNo: 'o', orderAmountCents: 5, userId: null }, 'userId'],
    ['/admin/coupons', { ...couponBody(), perUserLimit: null }, 'perUserLimit'],
  ])('answers null for an optional field of %s with 400 naming it (null is not "left out")', async (path, body, field) => {
    const res = await request(t.url).post(path).set(bearer(adminToken())).send(body);
    expect([res.status, res.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    expect(Object.keys(res.body.details.fields)).toContain(field);
  });

  it('refuses a JSON body that is not UTF-8 (it used to become U+FFFD, merging order numbers) or not JSON, naming body', async () => {
    const bytes = (s: string) => Buffer.concat([Buffer.from('{"name":"ORD-1-'), Buffer.from(s, 'latin1'), Buffer.from('"}')]);
    for (const body of [bytes('\xff'), bytes('\xfe'), Buffer.from('{"name": ')]) {
      // fetch sends the bytes as they are (supertest would serialise a Buffer as JSON).
      const res = await fetch(`${t.url}/admin/coupons`, {
        method: 'POST',
        headers: { ...bearer(adminToken()), 'Content-Type': 'application/json' },
        body,
      });
      const answer = (await res.json()) as { code: string; details?: { fields?: object } };
      expect([res.status, answer.code, Object.keys(answer.details?.fields ?? {})]).toEqual([400, 'VALIDATION_FAILED', ['body']]);
    }
  });

  it('takes an empty body sent as JSON as no body: a grab from a client that always sends the Content-Type works', async () => {
    const coupon = await createCoupon(t.url);
    const res = await grabRequest(t.url, coupon.id, 'empty-json').set('Content-Type', 'application/json').send('');
    expect([res.status, res.body.status]).toEqual([201, 'UNUSED']);
  });

  it('answers a malformed path like any other bad input: request id echoed, its language, the field named', async () => {
    for (const path of ['/coupons/%FF/grab', `/coupons/${'1'.repeat(600)}`]) {
      const res = await request(t.url).get(path).set('X-Request-Id', 'req-path-1').set('Accept-Language', 'zh-CN');
      expect([path, res.status, res.body.code, res.headers['x-request-id'], res.headers['content-language']]).toEqual([
        path,
        400,
        'VALIDATION_FAILED',
        'req-path-1',
        'zh-CN',
      ]);
      expect(Object.keys(res.body.details.fields)).toEqual(['path']);
    }
  });

  it('names the offending fields of a bad body', async () => {
    const res = await request(t.url).post('/admin/coupons').set(bearer(adminToken())).send({ name: '', totalStock: -1, unknownField: 1 });
    expect(res.status).toBe(400);
    expect(Object.keys(res.body.details.fields)).toEqual(
      expect.arrayContaining(['name', 'totalStock', 'unknownField', 'grabStartAt', 'validity', 'discount']),
    );
  });

  it('names only the type of a number that is not one, and only the range of one out of range', async () => {
    const usable = (amount: string) =>
      request(t.url)
        .get(`/me/coupons/usable?orderAmountCents=${amount}`)
        .set(bearer(tokenFor('errors-user')));
    for (const amount of ['abc', '-1', '1.5']) {
      expect((await usable(amount)).body.details.fields).toEqual({ orderAmountCents: ['orderAmountCents must be an integer number'] });
    }
    expect((await usable('99999999999999')).body.details.fields).toEqual({
      orderAmountCents: ['orderAmountCents must not be greater than 1000000000000'],
    });
    const body = await request(t.url)
      .post('/admin/coupons')
      .set(bearer(adminToken()))
      .send({ ...couponBody(), totalStock: -1, perUserLimit: 'x' });
    expect(body.body.details.fields).toEqual({
      totalStock: ['totalStock must not be less than 0'],
      perUserLimit: ['perUserLimit must be an integer number'],
    });
  });

  it('answers a body over 64 KiB with 413 PAYLOAD_TOO_LARGE', async () => {
    const res = await post(JSON.stringify({ name: 'x'.repeat(70 * 1024) }));
    expect([res.status, res.body.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
  });

  it('answers an unsupported content type with a 4xx in the error format', async () => {
    const res = await post('<xml/>', 'application/xml');
    expect(res.status).toBe(415);
    expect(res.body.code).toBe('UNSUPPORTED_MEDIA_TYPE');
  });

  /** Sends raw bytes and returns what the server answered before closing the connection. */
  function raw(bytes: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const { port } = new URL(t.url);
      const socket = connect(Number(port), '127.0.0.1', () => socket.end(bytes));
      let answer = '';
      socket.on('data', (d) => (answer += d.toString()));
      socket.on('close', () => resolve(answer));
      socket.on('error', reject);
    });
  }

  it.each([
    ['a garbled request line', 'GARBAGE\r\n\r\n', 400, 'VALIDATION_FAILED'],
    ['headers over the size limit', `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`, 431, 'HEADERS_TOO_LARGE'],
  ])('answers %s in the error format, before any route runs', async (_label, bytes, status, code) => {
    const answer = await raw(bytes);
    expect(answer.startsWith(`HTTP/1.1 ${status} `)).toBe(true);
    expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toEqual({ code, message: expect.any(String) });
  });

  it.each([
    ['an admin stock change', 'POST', (id: string) => `/admin/coupons/${id}/stock`, adminToken, '{"delta":1}', () => 'x', 200],
    ['a grab', 'POST', (id: string) => `/coupons/${id}/grab`, () => tokenFor('stray-byte-user'), '', () => 'GARBAGE\r\n\r\n', 201],
    [
      'an admin stock change, then a pipelined one whose chunked body breaks,',
      'POST',
      (id: string) => `/admin/coupons/${id}/stock`,
      adminToken,
      '{"delta":1}',
      (id: string) =>
        `POST /admin/coupons/${id}/stock HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${adminToken()}\r\n` +
        `Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n`,
      200,
    ],
  ])(
    'answers %s followed in the same packet by bytes that break the framing, then refuses the bytes',
    async (_label, method, path, token, body, junk, status) => {
      const coupon = await createCoupon(t.url, { totalStock: 5 });
      // Kept open by the client: a client's FIN would end a request still under way by itself.
      const answer = await new Promise<string>((resolve, reject) => {
        const socket = connect(Number(new URL(t.url).port), '127.0.0.1', () =>
          socket.write(
            `${method} ${path(coupon.id)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token()}\r\nIdempotency-Key: ${newKey()}\r\n` +
              `Content-Type: application/json\r\nX-Request-Id: before-junk\r\nContent-Length: ${body.length}\r\n\r\n${body}${junk(coupon.id)}`,
          ),
        );
        let received = '';
        socket.on('data', (d) => (received += d.toString()));
        socket.on('close', () => resolve(received));
        socket.on('error', reject);
      });
      // The request's change committed: its own answer says so, and only then does the broken part get
      // its 400 (not a 408 once its body never came whole).
      expect([...answer.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]))).toEqual([status, 400]);
      expect(answer).toMatch(/^x-request-id: before-junk\r$/im);
      const after = await request(t.url).get(`/admin/coupons/${coupon.id}`).set(bearer(adminToken()));
      expect(after.body.initStock + after.body.counts.issued).toBe(6);
    },
  );

  it('answers a method a path does not serve 404 NOT_FOUND, like a path that does not exist (no 405, no Allow)', async () => {
    const admin = bearer(adminToken());
    for (const res of [
      await request(t.url).put('/coupons/1').send({}),
      await request(t.url).delete('/admin/coupons/1').set(admin),
      await request(t.url).post('/health').send({}),
      await request(t.url).options('/me/coupons'),
    ]) {
      expect([res.status, res.body.code, res.headers.allow]).toEqual([404, 'NOT_FOUND', undefined]);
    }
  });

  it('opens its whole database pool at boot, before the first burst', async () => {
    const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM information_schema.processlist WHERE db = ?`, [t.config.DB_NAME])) as {
      n: string;
    }[];
    expect(Number(n)).toBeGreaterThanOrEqual(t.config.DB_POOL_SIZE);
  });

  it('answers ids out of the 64-bit range with 400', async () => {
    for (const id of ['0', '-1', '1.5', '99999999999999999999', '9223372036854775808', '%00']) {
      const res = await request(t.url).get(`/coupons/${id}`);
      expect([id, res.status, res.body.code]).toEqual([id, 400, 'VALIDATION_FAILED']);
    }
  });
});

describe('configuration', () => {
  it('refuses to start in production with the default secret', () => {
    expect(() => loadConfig({ NODE_ENV: 'production' })).toThrow(/default JWT_SECRET/);
    expect(loadConfig({ NODE_ENV: 'production', JWT_SECRET: 'a-long-production-secret-value' }).NODE_ENV).toBe('production');
  });

  it('names every invalid setting', () => {
    const load = () => loadConfig({ PORT: 'abc', DB_NAME: 'bad-name;', RATE_LIMIT_ENABLED: 'maybe' });
    for (const name of ['PORT', 'DB_NAME', 'RATE_LIMIT_ENABLED']) expect(load).toThrow(new RegExp(`\\b${name}:`));
  });

  it('has defaults that work on a developer machine', () => {
    const c = loadConfig({});
    expect([c.PORT, c.DB_HOST, c.DB_PORT, c.DB_USER, c.DB_PASSWORD, c.DB_NAME, c.RATE_LIMIT_PER_SECOND, c.RATE_LIMIT_ENABLED]).toEqual([
      3000,
      '127.0.0.1',
      3306,
      'root',
      '',
      'coupon',
      500,
      true,
    ]);
  });

  it("bounds a graceful stop by SHUTDOWN_TIMEOUT_MS: 20 s by default, inside Kubernetes' 30 s grace period; 1 s to an hour", () => {
    expect(loadConfig({}).SHUTDOWN_TIMEOUT_MS).toBe(20_000);
    expect(loadConfig({ SHUTDOWN_TIMEOUT_MS: '5000' }).SHUTDOWN_TIMEOUT_MS).toBe(5000);
    for (const bad of ['0', '999', '20s', '3600001']) {
      expect(() => loadConfig({ SHUTDOWN_TIMEOUT_MS: bad })).toThrow(/\bSHUTDOWN_TIMEOUT_MS:/);
    }
  });

  it('drains for SHUTDOWN_DRAIN_MS before closing (none by default), only if a request started at its end and 2 s to close still fit in SHUTDOWN_TIMEOUT_MS', () => {
    expect(loadConfig({}).SHUTDOWN_DRAIN_MS).toBe(0);
    expect(loadConfig({ SHUTDOWN_DRAIN_MS: '8000' }).SHUTDOWN_DRAIN_MS).toBe(8000);
    expect(() => loadConfig({ SHUTDOWN_DRAIN_MS: '8001' })).toThrow(
      "SHUTDOWN_DRAIN_MS: the drain (8001 ms), a request's deadline after it (REQUEST_TIMEOUT_MS, 10000 ms) and 2000 ms to close must fit in SHUTDOWN_TIMEOUT_MS (20000 ms)",
    );
    expect(loadConfig({ SHUTDOWN_DRAIN_MS: '25000', SHUTDOWN_TIMEOUT_MS: '40000' }).SHUTDOWN_DRAIN_MS).toBe(25_000);
    for (const bad of ['-1', '5s', '600001']) {
      expect(() => loadConfig({ SHUTDOWN_DRAIN_MS: bad })).toThrow(/\bSHUTDOWN_DRAIN_MS:/);
    }
  });
});

describe('AppError', () => {
  it('keeps a stack for faults (5xx) only; a refusal (4xx) skips the capture and leaves the global limit alone', () => {
    const limit = Error.stackTraceLimit;
    const refusal = new AppError('SOLD_OUT', 'sold out', { couponId: '1' });
    const fault = new AppError('SERVICE_UNAVAILABLE', 'down');
    expect(refusal.stack?.split('\n')).toEqual(['AppError: sold out']);
    expect(fault.stack?.split('\n').length).toBeGreaterThan(1);
    expect([refusal.code, refusal.status, refusal.details, refusal instanceof Error]).toEqual(['SOLD_OUT', 409, { couponId: '1' }, true]);
    expect(Error.stackTraceLimit).toBe(limit);
  });
});

describe('docs/api.md', () => {
  it('lists every error code under its status in its table of codes, and no other', () => {
    const text = readFileSync('docs/api.md', 'utf8');
    const table = text.slice(text.indexOf('| status | codes |'), text.indexOf('Which codes each route can give'));
    const listed: [string, number][] = [];
    for (const [, status, codes] of table.matchAll(/^\| (\d{3}) \| (.*) \|$/gm)) {
      for (const [, code] of codes.matchAll(/`([A-Z_]+)`/g)) listed.push([code, Number(status)]);
    }
    // Pairs, not a map: a code listed twice fails too.
    expect(listed.sort()).toEqual(Object.entries(ERROR_STATUS).sort());
  });
});
