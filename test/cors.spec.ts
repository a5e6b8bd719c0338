// The marketing front end on its own domain calls the API from shoppers' browsers (CORS_ORIGINS).
import { createServer, type Server } from 'node:http';
import type { Browser } from 'playwright-core';
import request from 'supertest';
import { loadConfig } from '../src/config/app-config.js';
import { createCoupon, newKey } from './support/factories.js';
import { launchChromium } from './support/browser.js';
import { bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { freePort } from './support/net.js';

const OTHER = 'https://elsewhere.example.com';

let shopPort: number;
let shop: string;
let t: TestApp;
let couponId: string;

beforeAll(async () => {
  shopPort = await freePort();
  shop = `http://127.0.0.1:${shopPort}`;
  // A default port is written by some, never sent by browsers.
  t = await startTestApp({ CORS_ORIGINS: `https://shop.example.com:443,${shop}` });
  couponId = (await createCoupon(t.url, { totalStock: 10 })).id;
});
afterAll(() => t.close());

const preflight = (origin: string, method = 'POST', headers = 'authorization,content-type,idempotency-key') =>
  request(t.url)
    .options(`/coupons/${couponId}/grab`)
    .set('Origin', origin)
    .set('Access-Control-Request-Method', method)
    .set('Access-Control-Request-Headers', headers);

describe('an allowed origin', () => {
  it('gets a preflight that lets a page grab: its methods, request headers, and a cached answer', async () => {
    const res = await preflight(shop);
    expect(res.status).toBe(204);
    expect(res.headers['access-control-allow-origin']).toBe(shop);
    expect(res.headers['access-control-allow-methods'].split(', ')).toEqual(expect.arrayContaining(['GET', 'POST', 'PATCH', 'DELETE']));
    expect(res.headers['access-control-allow-headers'].toLowerCase().split(', ')).toEqual(
      expect.arrayContaining(['authorization', 'content-type', 'idempotency-key', 'x-request-id', 'accept-language']),
    );
    expect(res.headers['access-control-max-age']).toBe('600');
    // Caches must not hand one origin's answer to another.
    expect(res.headers.vary).toMatch(/origin/i);
    expect(res.headers['x-request-id']).toBeDefined();
  });

  it('reads every header the service answers with, on a grab, its replay and its errors', async () => {
    const key = newKey();
    const grab = () =>
      request(t.url)
        .post(`/coupons/${couponId}/grab`)
        .set('Origin', shop)
        .set(bearer(tokenFor('cors-user')))
        .set('Idempotency-Key', key);
    const first = await grab();
    expect(first.status).toBe(201);
    expect(first.headers['access-control-allow-origin']).toBe(shop);
    const exposed = first.headers['access-control-expose-headers'].toLowerCase().split(', ');
    expect(exposed).toEqual(expect.arrayContaining(['x-request-id', 'idempotent-replayed', 'retry-after', 'content-language']));
    const replay = await grab();
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.headers['access-control-allow-origin']).toBe(shop);

    // A page must be able to read why it was refused.
    const refused = await request(t.url).post(`/coupons/${couponId}/grab`).set('Origin', shop).set('Idempotency-Key', newKey());
    expect(refused.status).toBe(401);
    expect(refused.body.code).toBe('UNAUTHENTICATED');
    expect(refused.headers['access-control-allow-origin']).toBe(shop);
  });

  it('gets a preflight without Access-Control-Request-Method too, never a plain-text 400', async () => {
    const res = await request(t.url).options(`/coupons/${couponId}`).set('Origin', 'https://shop.example.com');
    expect(res.status).toBe(204);
    expect(res.headers['access-control-allow-origin']).toBe('https://shop.example.com');
  });
});

describe('any other origin, or none', () => {
  it.each([OTHER, 'https://shop.example.com.evil.test', 'https://SHOP.example.com', 'null'])(
    '%s gets no CORS headers, and its preflight is 404 NOT_FOUND',
    async (origin) => {
      const pre = await preflight(origin);
      expect(pre.status).toBe(404);
      expect(pre.body.code).toBe('NOT_FOUND');
      expect(pre.headers['access-control-allow-origin']).toBeUndefined();
      const read = await request(t.url).get(`/coupons/${couponId}`).set('Origin', origin);
      expect(read.status).toBe(200);
      expect(read.headers['access-control-allow-origin']).toBeUndefined();
    },
  );

  it('reads the coupon page, which varies by Origin and by Accept-Encoding for the caches between', async () => {
    const res = await request(t.url).get(`/coupons/${couponId}`).set('Origin', shop).set('Accept-Encoding', 'gzip');
    expect(res.status).toBe(200);
    expect(res.headers['access-control-allow-origin']).toBe(shop);
    expect(res.headers.vary.toLowerCase().split(', ')).toEqual(['origin', 'accept-encoding']);
  });

  it('a server-to-server caller (no Origin) is answered as before', async () => {
    const res = await request(t.url).get(`/coupons/${couponId}`);
    expect(res.status).toBe(200);
    expect(res.headers['access-control-allow-origin']).toBeUndefined();
    expect((await request(t.url).options(`/coupons/${couponId}`)).status).toBe(404);
  });
});

describe('CORS_ORIGINS', () => {
  it('unset, no origin gets CORS headers and OPTIONS is 404', async () => {
    const plain = await startTestApp();
    try {
      const res = await request(plain.url)
        .options('/coupons/1/grab')
        .set('Origin', 'https://shop.example.com')
        .set('Access-Control-Request-Method', 'POST');
      expect(res.status).toBe(404);
      expect(res.headers['access-control-allow-origin']).toBeUndefined();
    } finally {
      await plain.close();
    }
  });

  it.each([
    '*',
    'https://Shop.example.com',
    'https://shop.example.com/',
    'shop.example.com',
    'https://a.example.com, https://b.example.com',
  ])('refuses %j at boot, naming the variable', (value) => {
    expect(() => loadConfig({ CORS_ORIGINS: value })).toThrow(/CORS_ORIGINS must be/);
  });
});

describe('in a browser', () => {
  let browser: Browser;
  let page: Server;
  beforeAll(async () => {
    // The shop's page, served from its own origin: a script that grabs through the API.
    page = createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>shop</title>'));
    await new Promise<void>((resolve) => page.listen(shopPort, '127.0.0.1', resolve));
    browser = await launchChromium();
  }, 60_000);
  afterAll(async () => {
    await browser?.close();
    await new Promise((resolve) => page.close(resolve));
  });

  /** Runs a grab from a page at `origin`: its status, Idempotent-Replayed and body, or the browser's refusal. */
  async function grabFrom(origin: string, key: string) {
    const tab = await browser.newPage();
    try {
      await tab.goto(origin);
      return await tab.evaluate(
        async ({ api, token, key }) => {
          try {
            const res = await fetch(api, { method: 'POST', headers: { authorization: token, 'idempotency-key': key } });
            return { status: res.status, replayed: res.headers.get('idempotent-replayed'), body: await res.json() };
          } catch (err) {
            return { refused: String(err) };
          }
        },
        { api: `${t.url}/coupons/${couponId}/grab`, token: bearer(tokenFor('browser-shopper')).Authorization, key },
      );
    } finally {
      await tab.close();
    }
  }

  it('a page of the shop grabs, and reads the replay header of a second press', async () => {
    const key = newKey();
    const first = await grabFrom(shop, key);
    expect(first).toMatchObject({ status: 201, replayed: null, body: { couponId } });
    expect(await grabFrom(shop, key)).toMatchObject({ status: 201, replayed: 'true' });
  }, 30_000);

  it('a page of another origin cannot read the API: the browser refuses it the answer', async () => {
    // localhost is another origin than 127.0.0.1 for the browser, though the same server.
    const result = await grabFrom(`http://localhost:${shopPort}`, newKey());
    expect(result).toEqual({ refused: expect.stringMatching(/Failed to fetch/) });
  }, 30_000);
});
