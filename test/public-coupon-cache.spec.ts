import { connect } from 'node:net';
import { jest } from '@jest/globals';
import request from 'supertest';
import { EntityManager, Repository } from 'typeorm';
import type { AppConfig } from '../src/config/app-config.js';
import { AheadExchange } from '../src/common/ahead-of-fastify.js';
import { SharedJson } from '../src/common/shared-json.js';
import { CouponService } from '../src/coupon/coupon.service.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { asUser, createCoupon, grabRequest, newKey } from './support/factories.js';
import { adminToken, bearer, startTestApp, TestApp } from './support/harness.js';
import { rawExchange } from './support/net.js';

interface Page {
  id: string;
  status: string;
  rateLimitPerSecond: number | null;
  initStock: number;
  remainingStock: number;
}

const page = async (t: TestApp, id: string): Promise<Page> => {
  const res = await request(t.url).get(`/coupons/${id}`);
  if (res.status !== 200) throw new Error(`GET /coupons/${id}: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body as Page;
};
const listed = async (t: TestApp, id: string): Promise<Page | undefined> =>
  ((await request(t.url).get('/coupons?limit=100')).body.items as Page[]).find((c) => c.id === id);
const patch = (t: TestApp, id: string, body: object) => request(t.url).patch(`/admin/coupons/${id}`).set(bearer(adminToken())).send(body);
let users = 0;
const grab = async (t: TestApp, id: string) => {
  const res = await grabRequest(t.url, id, `pc-user-${++users}`);
  expect([res.status, res.body.code]).toEqual([201, undefined]);
};

describe('public coupon page and list from memory, long COUPON_CACHE_TTL_MS: no database read, exact after own grabs', () => {
  let grouped: TestApp;
  let perRequest: TestApp;
  beforeAll(async () => {
    grouped = await startTestApp({ COUPON_CACHE_TTL_MS: '60000' });
    perRequest = await startTestApp({}, { ...grouped.config, GRAB_STRATEGY: 'per-request' } as AppConfig);
  });
  afterEach(async () => {
    expect(await checkInvariants(grouped.db)).toEqual([]);
  });
  afterAll(async () => {
    await perRequest?.close();
    await grouped?.close();
  });

  it('a burst of page and list reads sends the database no statement', async () => {
    const coupon = await createCoupon(grouped.url, { totalStock: 30 });
    await page(grouped, coupon.id);
    await listed(grouped, coupon.id);
    const spies = [
      jest.spyOn(EntityManager.prototype, 'query'),
      jest.spyOn(Repository.prototype, 'find'),
      jest.spyOn(Repository.prototype, 'findOneBy'),
    ];
    try {
      const answers = await Promise.all(
        Array.from({ length: 100 }, (_, i) => (i % 2 === 0 ? page(grouped, coupon.id) : listed(grouped, coupon.id))),
      );
      expect(answers.every((a) => a?.remainingStock === 30)).toBe(true);
      expect(spies.map((s) => s.mock.calls.length)).toEqual([0, 0, 0]);
    } finally {
      for (const s of spies) s.mockRestore();
    }
  });

  it("shows the exact stock after the instance's own grabs, grouped and per-request, on the page and in the list", async () => {
    const coupon = await createCoupon(grouped.url, { totalStock: 20, perUserLimit: 1 });
    expect((await page(grouped, coupon.id)).remainingStock).toBe(20);
    for (let i = 1; i <= 3; i++) {
      await grab(grouped, coupon.id);
      expect([(await page(grouped, coupon.id)).remainingStock, (await listed(grouped, coupon.id))?.remainingStock]).toEqual([
        20 - i,
        20 - i,
      ]);
    }
    await Promise.all(Array.from({ length: 12 }, () => grab(grouped, coupon.id)));
    expect((await page(grouped, coupon.id)).remainingStock).toBe(5);

    // The other instance reads the stock once, then its own grab shows at once there.
    expect((await page(perRequest, coupon.id)).remainingStock).toBe(5);
    await grab(perRequest, coupon.id);
    expect((await page(perRequest, coupon.id)).remainingStock).toBe(4);
    // ...and not on the first instance before its cache time is up: it answers from memory.
    expect((await page(grouped, coupon.id)).remainingStock).toBe(5);

    await Promise.all(Array.from({ length: 6 }, () => grabRequest(grouped.url, coupon.id, `pc-user-${++users}`)));
    expect([(await page(grouped, coupon.id)).remainingStock, (await listed(grouped, coupon.id))?.remainingStock]).toEqual([0, 0]);
    const [stock] = await grouped.db.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ?`, [coupon.id]);
    expect(Number(stock.stock)).toBe(0);
  });

  it('answers 404 for an unknown coupon; a change made through this instance shows at once', async () => {
    for (let i = 0; i < 2; i++) {
      const missing = await request(grouped.url).get('/coupons/987654321');
      expect([missing.status, missing.body.code]).toEqual([404, 'COUPON_NOT_FOUND']);
    }
    const coupon = await createCoupon(grouped.url, { totalStock: 10 });
    expect((await page(perRequest, coupon.id)).status).toBe('ACTIVE');
    expect((await patch(grouped, coupon.id, { status: 'PAUSED', rateLimitPerSecond: 33 })).status).toBe(200);
    expect(await page(grouped, coupon.id)).toMatchObject({ status: 'PAUSED', rateLimitPerSecond: 33 });
    expect(await listed(grouped, coupon.id)).toBeUndefined();
    const added = await request(grouped.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: 5 });
    expect(added.status).toBe(200);
    expect(await page(grouped, coupon.id)).toMatchObject({ initStock: 15, remainingStock: 15 });
    // The other instance still shows what it read, within its 60 s.
    expect(await page(perRequest, coupon.id)).toMatchObject({ status: 'ACTIVE', remainingStock: 10 });
  });
});

describe('public coupon page and list, short COUPON_CACHE_TTL_MS: changes through another instance show within it', () => {
  const TTL_MS = 600;
  // A page request that finds the value too old waits for one read; on a loaded machine that takes a while.
  const READ_SLACK_MS = 1000;
  let shown: TestApp;
  let other: TestApp;
  beforeAll(async () => {
    shown = await startTestApp({ COUPON_CACHE_TTL_MS: String(TTL_MS) });
    other = await startTestApp({}, shown.config);
  });
  afterAll(async () => {
    await other?.close();
    await shown?.close();
  });

  /**
   * Reads `read` every 20 ms (as a crowd would, so the background refresh is exercised) until
   * `changed` holds; then checks it keeps holding for `holdMs`. Returns how long after `since` it first held.
   */
  async function shownAfter<T>(since: number, read: () => Promise<T>, changed: (v: T) => boolean, holdMs = TTL_MS): Promise<number> {
    let firstAt: number | null = null;
    while (performance.now() - since < 5000) {
      const v = await read();
      if (changed(v)) firstAt ??= performance.now();
      else if (firstAt !== null) throw new Error(`went back to the old value after showing the new one: ${JSON.stringify(v)}`);
      if (firstAt !== null && performance.now() - firstAt >= holdMs) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    if (firstAt === null) throw new Error('never showed the change');
    return firstAt - since;
  }

  it('another instance’s grabs, template change and pause show on the page and in the list within the bound', async () => {
    const coupon = await createCoupon(shown.url, { totalStock: 50, perUserLimit: 1 });
    const onPage = () => page(shown, coupon.id);
    const inList = () => listed(shown, coupon.id);
    const bound = TTL_MS + READ_SLACK_MS;
    // Each change is made right after an earlier one has just shown, so the value it meets was read
    // a moment ago: what it measures is the cache's bound, not where in its cycle the change fell.
    await grab(other, coupon.id);
    await shownAfter(performance.now(), onPage, (p) => p.remainingStock === 49, 0);
    await grab(other, coupon.id);
    expect(await shownAfter(performance.now(), onPage, (p) => p.remainingStock === 48)).toBeLessThan(bound);
    await shownAfter(performance.now(), inList, (p) => p?.remainingStock === 48, 0);
    await grab(other, coupon.id);
    expect(await shownAfter(performance.now(), inList, (p) => p?.remainingStock === 47)).toBeLessThan(bound);

    expect((await patch(other, coupon.id, { rateLimitPerSecond: 70 })).status).toBe(200);
    await shownAfter(performance.now(), onPage, (p) => p.rateLimitPerSecond === 70, 0);
    expect((await patch(other, coupon.id, { rateLimitPerSecond: 77 })).status).toBe(200);
    expect(await shownAfter(performance.now(), onPage, (p) => p.rateLimitPerSecond === 77)).toBeLessThan(bound);

    await grab(other, coupon.id);
    await shownAfter(performance.now(), inList, (p) => p?.remainingStock === 46, 0);
    expect((await patch(other, coupon.id, { status: 'PAUSED' })).status).toBe(200);
    const since = performance.now();
    const [pausedOnPage, goneFromList] = await Promise.all([
      shownAfter(since, onPage, (p) => p.status === 'PAUSED'),
      shownAfter(since, inList, (p) => p === undefined),
    ]);
    expect(pausedOnPage).toBeLessThan(bound);
    expect(goneFromList).toBeLessThan(bound);
    expect(await checkInvariants(shown.db)).toEqual([]);
  });

  it('a coupon paused through another instance refuses grabs here once the TTL has passed, however long ago its template was read', async () => {
    const coupon = await createCoupon(shown.url, { totalStock: 50, perUserLimit: 1 });
    // This instance's template of the coupon is read now and then left to age: nobody grabs it for a while.
    await grab(shown, coupon.id);
    expect((await patch(other, coupon.id, { status: 'PAUSED' })).status).toBe(200);
    await new Promise((r) => setTimeout(r, 3 * TTL_MS));
    const late = await grabRequest(shown.url, coupon.id, `pc-user-${++users}`);
    expect([late.status, late.body.code]).toEqual([409, 'COUPON_PAUSED']);
    const issued = (await shown.db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?`, [coupon.id])) as { n: string }[];
    expect(Number(issued[0].n)).toBe(1);
  });
});

describe('public coupon page and list answered from memory ahead of the controller (public-reads.ts)', () => {
  const SHOP = 'https://shop.example.com';
  let t: TestApp;
  let coupons: CouponService;
  beforeAll(async () => {
    t = await startTestApp({ COUPON_CACHE_TTL_MS: '60000', CORS_ORIGINS: SHOP });
    coupons = t.app.get(CouponService);
    // Enough coupons for the list to be gzip'd (SharedJson's 1 KiB), so both forms are compared.
    for (let i = 0; i < 4; i++) await createCoupon(t.url, { totalStock: 10 });
  });
  afterEach(async () => {
    jest.restoreAllMocks();
    expect(await checkInvariants(t.db)).toEqual([]);
  });
  afterAll(() => t?.close());

  /** What a browser on the shop's site sends; the answer without what differs per answer. */
  const fetchAs = async (path: string, encoding: string) => {
    const res = await request(t.url).get(path).set('Origin', SHOP).set('Accept-Encoding', encoding);
    const { date: _date, 'x-request-id': requestId, ...headers } = res.headers;
    expect(requestId).toMatch(/./);
    return { status: res.status, headers, body: res.body as unknown };
  };

  it.each([
    ['the page', 'publicViewJson', (id: string) => `/coupons/${id}`],
    ['the list', 'liveCouponsJson', () => '/coupons'],
    ['a page of the list', 'liveCouponsJson', () => '/coupons?limit=2'],
  ] as const)('%s: once in memory, the same status, headers and body without the controller, gzip or not', async (_, method, path) => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const controller = jest.spyOn(coupons, method);
    for (const encoding of ['gzip, deflate, br, zstd', 'identity']) {
      // Nothing in memory: the first read goes through the controller, the second is answered from memory.
      coupons.invalidate(coupon.id);
      controller.mockClear();
      const first = await fetchAs(path(coupon.id), encoding);
      const again = await fetchAs(path(coupon.id), encoding);
      expect(first.status).toBe(200);
      expect(first.headers['access-control-allow-origin']).toBe(SHOP);
      // Kept by a browser or a CDN only if asked again: the stock changes by the second.
      expect(first.headers['cache-control']).toBe('no-cache');
      expect(again).toEqual(first);
      expect(controller).toHaveBeenCalledTimes(1);
      controller.mockClear();
    }
    // A grab through this instance shows at once on the page answered from memory.
    await grab(t, coupon.id);
    expect((await page(t, coupon.id)).remainingStock).toBe(9);
    expect(controller).not.toHaveBeenCalled();
  });

  it('leaves to the controller what it would refuse or read: a query, a body, another method, a malformed or unknown id', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    await page(t, coupon.id);
    await request(t.url).get('/coupons').expect(200);
    const unknown = await request(t.url).get(`/coupons/${coupon.id}?debug=1`);
    expect([unknown.status, unknown.body.details]).toEqual([400, { fields: { debug: ['property debug should not exist'] } }]);
    const listQuery = await request(t.url).get('/coupons?limit=0');
    expect([listQuery.status, listQuery.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    const withBody = await request(t.url).get(`/coupons/${coupon.id}`).set('Content-Type', 'application/json').send('{"a":1}');
    expect([withBody.status, withBody.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    const head = await request(t.url).head(`/coupons/${coupon.id}`);
    expect([head.status, head.headers['content-type']]).toEqual([200, 'application/json; charset=utf-8']);
    const notFound = await request(t.url).get('/coupons/987654321');
    expect([notFound.status, notFound.body.code]).toEqual([404, 'COUPON_NOT_FOUND']);
    expect((await request(t.url).get('/coupons/12x')).status).toBe(400);
    // Each refusal says no-cache too, the ones of hooks before the controller included (a CDN that keeps errors kept those).
    for (const res of [unknown, listQuery, withBody, head, notFound])
      expect([res.status, res.headers['cache-control']]).toEqual([res.status, 'no-cache']);
    for (const path of [`/coupons/${coupon.id}?%FF`, '/coupons?limit=5&limit=6', `/coupons/${coupon.id}?x=1&x=2`]) {
      const res = await request(t.url).get(path);
      expect([path, res.status, res.headers['cache-control']]).toEqual([path, 400, 'no-cache']);
    }
  });
});

describe("public coupon page and list answered ahead of Fastify, in the server's own request listener (public-reads.ts)", () => {
  const SHOP = 'https://shop.example.com';
  let plain: TestApp;
  let withCors: TestApp;
  beforeAll(async () => {
    plain = await startTestApp({ COUPON_CACHE_TTL_MS: '60000' });
    withCors = await startTestApp({}, { ...plain.config, CORS_ORIGINS: SHOP } as AppConfig);
    // Enough coupons for the list to be gzip'd (SharedJson's 1 KiB), so both forms are compared.
    for (let i = 0; i < 4; i++) await createCoupon(plain.url, { totalStock: 10 });
  });
  afterEach(async () => {
    jest.restoreAllMocks();
    expect(await checkInvariants(plain.db)).toEqual([]);
  });
  afterAll(async () => {
    await withCors?.close();
    await plain?.close();
  });

  /** The answer without what differs per answer; Fastify's way replies through SharedJson.body, the listener does not. */
  const fetch = async (t: TestApp, path: string, headers: Record<string, string>) => {
    const viaFastify = jest.spyOn(SharedJson.prototype, 'body');
    const res = await request(t.url).get(path).set(headers);
    const { date: _date, 'x-request-id': requestId, ...rest } = res.headers;
    const way = viaFastify.mock.calls.length > 0 ? 'fastify' : 'listener';
    viaFastify.mockRestore();
    return { way, requestId, answer: { status: res.status, headers: rest, body: res.body as unknown } };
  };
  const served = (text: string, route: string) =>
    Number(
      text
        .split('\n')
        .find((l) => l.startsWith('http_request_duration_seconds_count{') && l.includes(`route="${route}"`) && l.includes('status="200"'))
        ?.split(' ')[1] ?? 0,
    );

  it.each([
    ['the page', 'publicViewJson', (id: string) => `/coupons/${id}`, '/coupons/:couponId'],
    ['the list', 'liveCouponsJson', () => '/coupons', '/coupons'],
    ['the list with an empty query', 'liveCouponsJson', () => '/coupons?', '/coupons'],
    ['a page of the list', 'liveCouponsJson', () => '/coupons?limit=2', '/coupons'],
  ] as const)(
    '%s: the same status, headers and body as through Fastify and the controller, with and without CORS, gzip or not',
    async (_, method, path, route) => {
      const coupon = await createCoupon(plain.url, { totalStock: 10 });
      for (const t of [plain, withCors]) {
        const coupons = t.app.get(CouponService);
        const controller = jest.spyOn(coupons, method);
        for (const encoding of ['gzip, deflate, br, zstd', 'identity']) {
          coupons.invalidate(coupon.id);
          controller.mockClear();
          const before = served((await request(t.url).get('/metrics')).text, route);
          const first = await fetch(t, path(coupon.id), { 'Accept-Encoding': encoding });
          const again = await fetch(t, path(coupon.id), { 'Accept-Encoding': encoding, 'X-Request-Id': 'shop-req-1' });
          expect([first.way, again.way]).toEqual(['fastify', 'listener']);
          expect(controller).toHaveBeenCalledTimes(1);
          expect(first.answer.status).toBe(200);
          expect(again.answer).toEqual(first.answer);
          expect(again.requestId).toBe('shop-req-1');
          // Each answer is counted on its route, as Fastify's way counts it.
          expect(served((await request(t.url).get('/metrics')).text, route)).toBe(before + 2);
        }
      }
    },
  );

  it('leaves to Fastify what a hook of its way would change, and answers it the same', async () => {
    const coupon = await createCoupon(plain.url, { totalStock: 10 });
    const page = `/coupons/${coupon.id}`;
    await request(withCors.url).get(page).expect(200);
    const alone = await fetch(withCors, page, {});
    expect(alone.way).toBe('listener');
    // An Origin, allowed or not, goes to the CORS hook, which answers from memory with its headers.
    const fromShop = await fetch(withCors, page, { Origin: SHOP });
    expect([fromShop.way, fromShop.answer.headers['access-control-allow-origin']]).toEqual(['fastify', SHOP]);
    const fromElsewhere = await fetch(withCors, page, { Origin: 'https://elsewhere.example.com' });
    expect(fromElsewhere).toMatchObject({ way: 'fastify', answer: alone.answer });
    // A request id the rules refuse is replaced, as Fastify's way replaces it.
    const odd = await fetch(withCors, page, { 'X-Request-Id': '<b>odd</b>' });
    expect([odd.way, odd.requestId]).toEqual(['listener', expect.stringMatching(/^[0-9a-f-]{36}$/)]);
    // Paths Fastify's router reads otherwise, or refuses, are its own.
    for (const [path, status] of [
      [`/coupons/0${coupon.id}`, 400],
      [`/Coupons/${coupon.id}`, 404],
      [`/coupons/${coupon.id}/`, 404],
      ['/coupons?limit=2&limit=2', 400],
    ] as const) {
      const other = await fetch(withCors, path, {});
      expect([path, other.answer.status]).toEqual([path, status]);
    }
    // Pipelined on one connection, the answers of both ways keep the requests' order.
    const pipelined = await rawExchange(
      withCors.url,
      [`GET ${page} HTTP/1.1\r\nHost: x\r\nX-Request-Id: p1\r\n\r\n`, `GET /nowhere HTTP/1.1\r\nHost: x\r\nX-Request-Id: p2\r\n\r\n`]
        .concat(`GET ${page} HTTP/1.1\r\nHost: x\r\nX-Request-Id: p3\r\nConnection: close\r\n\r\n`)
        .join(''),
    );
    const answered = [...pipelined.matchAll(/HTTP\/1\.1 (\d+)[^]*?\r\nx-request-id: (\S+)/gi)].map((m) => `${m[1]} ${m[2]}`);
    expect(answered).toEqual(['200 p1', '404 p2', '200 p3']);
    // Without CORS an Origin changes nothing.
    await request(plain.url).get(page).expect(200);
    expect((await fetch(plain, page, { Origin: SHOP })).way).toBe('listener');
    // A %-escape or a query is Fastify's to read: the same coupon and answer, the query refused.
    const escaped = await fetch(withCors, `/coupons/%3${coupon.id.slice(0, 1)}${coupon.id.slice(1)}`, {});
    expect(escaped).toMatchObject({ way: 'fastify', answer: alone.answer });
    const query = await request(withCors.url).get(`${page}?debug=1`);
    expect([query.status, query.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    const withBody = await request(withCors.url).get(page).set('Content-Type', 'application/json').send('{"a":1}');
    expect([withBody.status, withBody.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    const head = await request(withCors.url).head(page);
    expect([head.status, head.headers['content-type']]).toEqual([200, 'application/json; charset=utf-8']);
    // HTTP/1.1 without Host: refused in the error format, by Fastify's way.
    const raw = await rawExchange(withCors.url, `GET ${page} HTTP/1.1\r\nConnection: close\r\n\r\n`);
    expect(raw).toMatch(/^HTTP\/1\.1 400 /);
    expect(raw).toContain('VALIDATION_FAILED');
  });
});

describe('the page and the grab answered ahead of Fastify while the server closes', () => {
  it('leaves a read or a grab arriving then to Fastify, which refuses them 503 in the error format', async () => {
    const t = await startTestApp({ COUPON_CACHE_TTL_MS: '60000' });
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    await request(t.url).get(`/coupons/${coupon.id}`).expect(200);
    const { Authorization: token } = asUser('closing');
    const heads = [
      `GET /coupons/${coupon.id} HTTP/1.1\r\nHost: x\r\n`,
      `POST /coupons/${coupon.id}/grab HTTP/1.1\r\nHost: x\r\nAuthorization: ${token}\r\nIdempotency-Key: ${newKey()}\r\n`,
    ];
    // Headers not complete at the close, so the connection is not idle and the request arrives once it is closing.
    const exchanges = await Promise.all(
      heads.map(async (head) => {
        const socket = connect(Number(new URL(t.url).port), '127.0.0.1');
        const answer = { text: '' };
        socket.on('data', (d: Buffer) => (answer.text += d.toString()));
        const closed = new Promise<void>((ok) => socket.once('close', () => ok()));
        await new Promise<void>((ok) => socket.write(head, () => ok()));
        return { socket, answer, closed };
      }),
    );
    // Read by the server before it closes: a connection it has read nothing from yet is idle, and closed unanswered.
    await new Promise((ok) => setTimeout(ok, 100));
    const fromMemory = jest.spyOn(SharedJson.prototype, 'encodedFor');
    const ahead = jest.spyOn(AheadExchange.prototype, 'send');
    const closing = t.close();
    await new Promise((ok) => setTimeout(ok, 200));
    for (const { socket } of exchanges) socket.write('\r\n');
    await Promise.all(exchanges.map((e) => e.closed));
    await closing;
    for (const { answer } of exchanges) {
      expect(answer.text).toMatch(/^HTTP\/1\.1 503 /);
      expect(answer.text).toContain('"code":"SERVICE_UNAVAILABLE"');
      expect(answer.text.toLowerCase()).toContain('connection: close');
    }
    expect([fromMemory.mock.calls.length, ahead.mock.calls.length]).toEqual([0, 0]);
    fromMemory.mockRestore();
    ahead.mockRestore();
  });
});
