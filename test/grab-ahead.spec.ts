import { request as httpRequest } from 'node:http';
import { jest } from '@jest/globals';
import request from 'supertest';
import { createApp } from '../src/app.factory.js';
import { AuthGuard } from '../src/auth/auth.guard.js';
import { AheadExchange } from '../src/common/ahead-of-fastify.js';
import { GrabService } from '../src/coupon/grab.service.js';
import type { UserCoupon } from '../src/ledger/user-coupon.entity.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { asUser, createCoupon, newKey } from './support/factories.js';
import { rawExchange } from './support/net.js';
import { adminToken, bearer, createTestDatabase, dropTestDatabase, startTestApp, TestApp, testConfig } from './support/harness.js';

/**
 * A plain grab is answered ahead of Fastify, in the server's own request listener, or, with an
 * Origin on a server with CORS, in a hook of its route ahead of Nest's handler chain
 * (src/coupon/grab-ahead.ts); a trailing `?` (an empty query, which the controller accepts; sent
 * over plain node:http, since supertest and URLs drop it) sends the same grab through the
 * controller. Each case asks all three ways, in states that give the same outcome, and compares
 * what a client can see: status, the headers the grab answers with, and the body, with the values
 * that differ by user, key and time replaced by their type.
 */

type Way = 'listener' | 'hook' | 'controller';
const WAYS: Way[] = ['listener', 'hook', 'controller'];
const ORIGIN = 'https://shop.example.com';
const HEADERS = ['content-type', 'idempotent-replayed', 'content-language', 'retry-after', 'vary', 'connection'];
const VARYING = new Set(['id', 'userId', 'issuedAt', 'validFrom', 'expiresAt', 'idempotencyKey', 'lookup']);

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: unknown;
}

/** A POST with its path sent exactly as given (a URL would lose an empty query's `?`). */
const post = (url: string, path: string, headers: Record<string, string>): Promise<Answer> =>
  new Promise((resolve, reject) => {
    const { hostname, port } = new URL(url);
    const req = httpRequest({ hostname, port, path, method: 'POST', headers }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (text += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: JSON.parse(text) as unknown }));
    });
    req.on('error', reject);
    req.end();
  });

/** What a client sees of an answer, minus the values that differ between two users' grabs. */
function seen(res: Answer): unknown {
  const strip = (v: unknown): unknown =>
    v && typeof v === 'object' && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, VARYING.has(k) ? typeof x : strip(x)]))
      : v;
  return { status: res.status, headers: Object.fromEntries(HEADERS.map((h) => [h, res.headers[h]])), body: strip(res.body) };
}

describe('the grab answered ahead of Fastify and of Nest: the same answers as the controller', () => {
  let t: TestApp;
  let users = 0;
  // Nest's chain begins with this guard (the controller's own method cannot be spied on: Nest reads
  // the route from its metadata).
  const controllerGrabs = jest.spyOn(AuthGuard.prototype, 'canActivate');
  const listenerAnswers = jest.spyOn(AheadExchange.prototype, 'send');
  const path = (couponId: string, way: Way) => `/coupons/${couponId}/grab${way === 'controller' ? '?' : ''}`;
  const headersOf = (way: Way, key: string, language = 'en') => ({
    'Idempotency-Key': key,
    'Accept-Language': language,
    ...(way === 'hook' ? { Origin: ORIGIN } : {}),
  });
  const grab = (couponId: string, way: Way, userId = `ga-${++users}`, key = newKey(), language = 'en') =>
    post(t.url, path(couponId, way), { ...asUser(userId), ...headersOf(way, key, language) });
  /** Every way for each case; and which way answered, so a way that stopped answering fails here. */
  async function allWays(ask: (way: Way) => Promise<Answer>): Promise<unknown[]> {
    const answers: unknown[] = [];
    for (const way of WAYS) {
      controllerGrabs.mockClear();
      listenerAnswers.mockClear();
      answers.push(seen(await ask(way)));
      const ran = [controllerGrabs.mock.calls.length, listenerAnswers.mock.calls.length];
      expect([way, ...ran]).toEqual([way, way === 'controller' ? 1 : 0, way === 'listener' ? 1 : 0]);
    }
    return answers;
  }
  /** The answers of every way to one case, the same. */
  async function sameAllWays(ask: (way: Way) => Promise<Answer>): Promise<unknown> {
    const [first, ...others] = await allWays(ask);
    for (const other of others) expect(other).toEqual(first);
    return first;
  }

  beforeAll(async () => {
    // Under CORS, a grab with an Origin is answered by the hook, one without by the listener.
    t = await startTestApp({ CORS_ORIGINS: ORIGIN });
  });
  afterEach(async () => {
    expect(await checkInvariants(t.db)).toEqual([]);
  });
  afterAll(async () => {
    controllerGrabs.mockRestore();
    listenerAnswers.mockRestore();
    await t?.close();
  });

  it('issues (201), replays (Idempotent-Replayed), and refuses a key reused on another coupon (422)', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const other = await createCoupon(t.url, { totalStock: 10 });
    const keyOf = Object.fromEntries(WAYS.map((way) => [way, newKey()]));
    const issued = await sameAllWays((way) => grab(coupon.id, way, `ga-replay-${way}`, keyOf[way]));
    expect(issued).toMatchObject({ status: 201, headers: { vary: 'Origin' }, body: { couponId: coupon.id, status: 'UNUSED' } });
    const replayed = await sameAllWays((way) => grab(coupon.id, way, `ga-replay-${way}`, keyOf[way]));
    expect(replayed).toMatchObject({ status: 201, headers: { 'idempotent-replayed': 'true' } });
    const reused = await sameAllWays((way) => grab(other.id, way, `ga-replay-${way}`, keyOf[way]));
    expect(reused).toMatchObject({ status: 422, body: { code: 'IDEMPOTENCY_KEY_REUSED' } });
  });

  it('refuses alike: sold out, the per-user limit, paused, an unknown coupon, in the language asked for', async () => {
    const soldOut = await createCoupon(t.url, { totalStock: 1 });
    expect((await grab(soldOut.id, 'listener')).status).toBe(201);
    const limited = await createCoupon(t.url, { totalStock: 10, perUserLimit: 1 });
    const paused = await createCoupon(t.url, { totalStock: 10 });
    expect((await request(t.url).patch(`/admin/coupons/${paused.id}`).set(bearer(adminToken())).send({ status: 'PAUSED' })).status).toBe(
      200,
    );
    for (const way of WAYS) expect((await grab(limited.id, 'listener', `ga-limit-${way}`)).status).toBe(201);

    const cases: [string, (way: Way) => Promise<Answer>][] = [
      ['SOLD_OUT', (way) => grab(soldOut.id, way)],
      ['USER_LIMIT_REACHED', (way) => grab(limited.id, way, `ga-limit-${way}`)],
      ['COUPON_PAUSED', (way) => grab(paused.id, way)],
      ['COUPON_NOT_FOUND', (way) => grab('999999999', way)],
    ];
    for (const [code, ask] of cases) {
      expect(await sameAllWays(ask)).toMatchObject({ body: { code } });
    }
    const zh = await sameAllWays((way) => grab(soldOut.id, way, undefined, undefined, 'zh-CN'));
    expect(zh).toMatchObject({ status: 409, headers: { 'content-language': 'zh-CN' }, body: { code: 'SOLD_OUT' } });
  });

  it('a fault is a 500 from the one filter, a grab past its deadline a 503, the grab run once: neither a rejection without a reason nor a throw after the grab escapes', async () => {
    // On an app of its own without the contract's check of every answer: a 500 is no answer a client
    // can cause, and the contract leaves it out.
    const config = testConfig({ CORS_ORIGINS: ORIGIN, REQUEST_TIMEOUT_MS: '1000' });
    await createTestDatabase(config);
    const app = await createApp(config);
    await app.listen({ port: 0, host: '127.0.0.1' });
    const url = `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;
    const grabs = jest.spyOn(GrabService.prototype, 'grab');
    const internal = { status: 500, body: { code: 'INTERNAL' } };
    const faults: [string, () => void, object][] = [
      // done(undefined) would have meant "go on": to the controller, and a second grab.
      ['a rejection without a reason', () => grabs.mockRejectedValueOnce(undefined), internal],
      ['an error', () => grabs.mockRejectedValueOnce(new Error('boom')), internal],
      // Building the answer throws: unhandled, this rejection ended the process.
      ['a throw after the grab', () => grabs.mockResolvedValueOnce({ userCoupon: {} as UserCoupon, replayed: false }), internal],
      [
        'a grab that never ends',
        () => grabs.mockReturnValueOnce(new Promise(() => undefined)),
        { status: 503, headers: { 'retry-after': '1' }, body: { code: 'SERVICE_UNAVAILABLE' } },
      ],
    ];
    try {
      const coupon = await createCoupon(url, { totalStock: 10 });
      for (const [fault, arrange, expected] of faults) {
        const [first, ...others] = await allWays(async (way) => {
          grabs.mockClear();
          arrange();
          const answer = await post(url, path(coupon.id, way), { ...asUser(`ga-${++users}`), ...headersOf(way, newKey()) });
          expect([fault, way, grabs.mock.calls.length]).toEqual([fault, way, 1]);
          return answer;
        });
        expect([fault, first]).toMatchObject([fault, expected]);
        for (const other of others) expect([fault, other]).toEqual([fault, first]);
      }
    } finally {
      grabs.mockRestore();
      await app.close();
      await dropTestDatabase(config);
    }
  });

  it('an empty JSON body is still a plain grab; what the controller refuses goes to the controller', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    controllerGrabs.mockClear();
    listenerAnswers.mockClear();
    const empty = await request(t.url)
      .post(path(coupon.id, 'hook'))
      .set(asUser('ga-empty'))
      .set('Idempotency-Key', newKey())
      .set('Content-Type', 'application/json')
      .send('{}');
    // A body is Fastify's to read: the hook answers it.
    expect([empty.status, controllerGrabs.mock.calls.length, listenerAnswers.mock.calls.length]).toEqual([201, 0, 0]);

    const plain = (couponId: string, userId: string, key = newKey()) =>
      request(t.url).post(`/coupons/${couponId}/grab`).set(asUser(userId)).set('Idempotency-Key', key);
    const refused: [number, string, () => request.Test][] = [
      [401, 'UNAUTHENTICATED', () => request(t.url).post(`/coupons/${coupon.id}/grab`).set('Idempotency-Key', newKey())],
      [401, 'UNAUTHENTICATED', () => plain(coupon.id, 'ga-token').set('Authorization', 'Bearer not-a-token')],
      [400, 'VALIDATION_FAILED', () => plain(coupon.id, 'ga-bad-key', 'not a key!')],
      [400, 'VALIDATION_FAILED', () => plain('01', 'ga-bad-id')],
      [400, 'VALIDATION_FAILED', () => plain(coupon.id, 'ga-body').send({ couponId: coupon.id })],
      [400, 'VALIDATION_FAILED', () => plain(coupon.id, 'ga-query').query({ x: 1 })],
    ];
    for (const [status, code, ask] of refused) {
      controllerGrabs.mockClear();
      listenerAnswers.mockClear();
      const res = await ask();
      expect([res.status, res.body.code, controllerGrabs.mock.calls.length, listenerAnswers.mock.calls.length]).toEqual([
        status,
        code,
        1,
        0,
      ]);
    }
  });

  it('leaves to Fastify a grab its body parsers or hooks would read or refuse: the answer is theirs', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const token = () => asUser(`ga-${++users}`).Authorization;
    // The first digit %-escaped: the router decodes it to the same id.
    const escaped = `/coupons/%${coupon.id.charCodeAt(0).toString(16)}${coupon.id.slice(1)}/grab`;
    const cases: [string, string, string, number, string | undefined][] = [
      ['Content-Length 00 (a body to Fastify)', path(coupon.id, 'listener'), 'Content-Length: 00\r\n', 415, 'UNSUPPORTED_MEDIA_TYPE'],
      ['a Content-Encoding', path(coupon.id, 'listener'), 'Content-Length: 0\r\nContent-Encoding: gzip\r\n', 415, 'UNSUPPORTED_MEDIA_TYPE'],
      [
        'a Content-Type no route takes',
        path(coupon.id, 'listener'),
        'Content-Length: 0\r\nContent-Type: text/csv\r\n',
        415,
        'UNSUPPORTED_MEDIA_TYPE',
      ],
      [
        'a malformed Content-Type',
        path(coupon.id, 'listener'),
        'Content-Length: 0\r\nContent-Type: foo\r\n',
        415,
        'UNSUPPORTED_MEDIA_TYPE',
      ],
      ['two Authorization headers', path(coupon.id, 'listener'), `Authorization: ${token()}\r\n`, 401, 'UNAUTHENTICATED'],
      // Read by Fastify as a plain grab, so answered by the hook.
      ['a chunked body that ends at once', path(coupon.id, 'listener'), 'Transfer-Encoding: chunked\r\n', 201, undefined],
      ['a %-escaped path', escaped, '', 201, undefined],
    ];
    for (const [name, target, extra, status, code] of cases) {
      controllerGrabs.mockClear();
      listenerAnswers.mockClear();
      const body = extra.includes('chunked') ? '0\r\n\r\n' : '';
      const raw = await rawExchange(
        t.url,
        `POST ${target} HTTP/1.1\r\nHost: x\r\nAuthorization: ${token()}\r\nIdempotency-Key: ${newKey()}\r\n${extra}Connection: close\r\n\r\n${body}`,
      );
      const [head, text] = raw.split('\r\n\r\n');
      const answer = { status: Number(head.split(' ')[1]), code: (JSON.parse(text) as { code?: string }).code };
      expect([name, answer, listenerAnswers.mock.calls.length]).toEqual([name, { status, code }, 0]);
    }
    // An HTTP/1.1 request without Host: Fastify's hook refuses it.
    listenerAnswers.mockClear();
    const hostless = await rawExchange(
      t.url,
      `POST ${path(coupon.id, 'listener')} HTTP/1.1\r\nAuthorization: ${token()}\r\nIdempotency-Key: ${newKey()}\r\nConnection: close\r\n\r\n`,
    );
    expect([hostless.split(' ')[1], listenerAnswers.mock.calls.length]).toEqual(['400', 0]);
  });
});
