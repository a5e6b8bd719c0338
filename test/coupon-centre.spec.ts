import { jest } from '@jest/globals';
import { gunzipSync } from 'node:zlib';
import request from 'supertest';
import * as undici from 'undici';
import { EntityManager, Repository } from 'typeorm';
import { createCoupon, couponBody, CouponInput, grabUserCoupon, newKey, newUserCoupon } from './support/factories.js';
import { MIN_GZIP_BYTES } from '../src/common/shared-json.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { databaseFingerprint } from './support/fingerprint.js';

const HOUR = 3600_000;
const DAY = 24 * HOUR;

describe('discount types, usable coupons and the public coupon list', () => {
  let t: TestApp;
  let seq = 0;
  beforeAll(async () => {
    t = await startTestApp({ COUPON_CACHE_TTL_MS: '300' });
  });
  afterEach(async () => {
    expect(await checkInvariants(t.db)).toEqual([]);
  });
  afterAll(() => t.close());

  const admin = () => bearer(adminToken());
  const create = (body: object) => request(t.url).post('/admin/coupons').set(admin()).send(body);
  const grab = async (userId: string, overrides: CouponInput = {}) => (await newUserCoupon(t.url, userId, overrides)).id;

  describe('discount types', () => {
    it('creates AMOUNT (type optional) and PERCENT discounts and shows them; stackable defaults to false', async () => {
      const amount = await create(couponBody({ discount: { thresholdCents: 100, amountCents: 50 } }));
      expect(amount.status).toBe(201);
      expect(amount.body).toMatchObject({ discount: { type: 'AMOUNT', thresholdCents: 100, amountCents: 50 }, stackable: false });
      const percent = await create({
        ...couponBody(),
        stackable: true,
        discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 15, maxDiscountCents: 2000 },
      });
      expect(percent.status).toBe(201);
      expect(percent.body).toMatchObject({
        discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 15, maxDiscountCents: 2000 },
        stackable: true,
      });
      const uncapped = await create({ ...couponBody(), discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 100 } });
      expect(uncapped.body.discount).toEqual({ type: 'PERCENT', thresholdCents: 0, percentOff: 100, maxDiscountCents: null });
      const read = await request(t.url).get(`/coupons/${percent.body.id}`);
      expect(read.body.discount).toEqual(percent.body.discount);
    });

    it('takes a discount as a coupon shows it: maxDiscountCents null is no cap, the same request as leaving it out', async () => {
      const key = newKey();
      const body = couponBody({ discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 40 } });
      const first = await create(body).set('Idempotency-Key', key);
      expect([first.status, first.body.discount]).toEqual([
        201,
        { type: 'PERCENT', thresholdCents: 0, percentOff: 40, maxDiscountCents: null },
      ]);
      const sentBack = await create({ ...body, discount: first.body.discount }).set('Idempotency-Key', key);
      expect([sentBack.status, sentBack.headers['idempotent-replayed'], sentBack.body.id]).toEqual([201, 'true', first.body.id]);
      const copy = await create({ ...body, discount: first.body.discount });
      expect([copy.status, copy.body.discount]).toEqual([201, first.body.discount]);
      const amount = await create({
        ...couponBody(),
        discount: { type: 'AMOUNT', thresholdCents: 0, amountCents: 5, maxDiscountCents: null },
      });
      expect([amount.status, amount.body.discount]).toEqual([201, { type: 'AMOUNT', thresholdCents: 0, amountCents: 5 }]);
    });

    it('refuses bad discounts with 400 naming the field, creating nothing', async () => {
      const fingerprint = await databaseFingerprint(t.db);
      for (const [discount, field] of [
        [{ type: 'PERCENT', thresholdCents: 0, percentOff: 0 }, 'discount.percentOff'],
        [{ type: 'PERCENT', thresholdCents: 0, percentOff: 101 }, 'discount.percentOff'],
        [{ type: 'PERCENT', thresholdCents: 0, percentOff: 12.5 }, 'discount.percentOff'],
        [{ type: 'PERCENT', thresholdCents: 0 }, 'discount.percentOff'],
        [{ type: 'PERCENT', thresholdCents: 0, percentOff: 10, maxDiscountCents: 0 }, 'discount.maxDiscountCents'],
        [{ type: 'PERCENT', thresholdCents: 0, percentOff: 10, amountCents: 5 }, 'discount.amountCents'],
        [{ type: 'AMOUNT', thresholdCents: 0, amountCents: 5, percentOff: 10 }, 'discount'],
        [{ thresholdCents: 0 }, 'discount.amountCents'],
        [{ type: 'FREE', thresholdCents: 0, amountCents: 5 }, 'discount.type'],
      ] as const) {
        const res = await create({ ...couponBody(), discount });
        expect([JSON.stringify(discount), res.status, res.body.code]).toEqual([JSON.stringify(discount), 400, 'VALIDATION_FAILED']);
        expect(Object.keys(res.body.details.fields)).toContain(field);
      }
      const stack = await create({ ...couponBody(), stackable: 'yes' });
      expect(Object.keys(stack.body.details.fields)).toContain('stackable');
      expect(await databaseFingerprint(t.db)).toEqual(fingerprint);
    });

    it('a PERCENT coupon takes its percent off, capped, on holds and redemptions alike', async () => {
      const discount = { type: 'PERCENT' as const, thresholdCents: 1000, percentOff: 15, maxDiscountCents: 2000 };
      const [a, b] = [await grab('pc', { discount }), await grab('pc', { discount })];
      const held = await request(t.url)
        .post('/redemptions/holds')
        .set(bearer(tokenFor('pc')))
        .send({ userCouponId: a, orderNo: `P-${++seq}`, orderAmountCents: 9999 });
      expect([held.status, held.body.discountCents]).toEqual([201, 1499]);
      const used = await request(t.url)
        .post('/redemptions')
        .set(bearer(tokenFor('pc')))
        .send({ userCouponId: b, orderNo: `P-${++seq}`, orderAmountCents: 50000 });
      expect([used.status, used.body.discountCents]).toEqual([201, 2000]);
      const c = await grab('pc', { discount });
      const below = await request(t.url)
        .post('/redemptions')
        .set(bearer(tokenFor('pc')))
        .send({ userCouponId: c, orderNo: `P-${++seq}`, orderAmountCents: 999 });
      expect([below.status, below.body.code]).toEqual([422, 'THRESHOLD_NOT_MET']);
    });
  });

  describe('GET /me/coupons/usable', () => {
    it('lists the coupons usable now on that order, largest discount first, then soonest expiry, with the discount of each', async () => {
      const user = 'shopper';
      const fixed = (days: number) => ({
        type: 'FIXED' as const,
        startAt: new Date(Date.now() - HOUR).toISOString(),
        endAt: new Date(Date.now() + days * DAY).toISOString(),
      });
      const big = await grab(user, { discount: { thresholdCents: 0, amountCents: 3000 }, validity: fixed(5) });
      const bigSooner = await grab(user, { discount: { thresholdCents: 0, amountCents: 3000 }, validity: fixed(2) });
      const percent = await grab(user, { discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 10 }, validity: fixed(1) });
      const tooHigh = await grab(user, { discount: { thresholdCents: 50_000, amountCents: 9000 } });
      const future = await grab(user, {
        validity: { type: 'FIXED', startAt: new Date(Date.now() + DAY).toISOString(), endAt: new Date(Date.now() + 2 * DAY).toISOString() },
        discount: { thresholdCents: 0, amountCents: 100 },
      });
      const used = await grab(user, { discount: { thresholdCents: 0, amountCents: 100 } });
      const held = await grab(user, { discount: { thresholdCents: 0, amountCents: 100 } });
      const heldShort = await grab(user, { discount: { thresholdCents: 0, amountCents: 200 } });
      const expired = await grab(user, { discount: { thresholdCents: 0, amountCents: 100 } });
      await t.db.query(`UPDATE user_coupon SET expires_at = ? WHERE id = ?`, [new Date(Date.now() - 1000), expired]);
      const send = (path: string, body: Record<string, unknown>) =>
        request(t.url)
          .post(path)
          .set(bearer(tokenFor(user)))
          .send(body);
      expect((await send('/redemptions', { userCouponId: used, orderNo: `U-${++seq}`, orderAmountCents: 1000 })).status).toBe(201);
      expect((await send('/redemptions/holds', { userCouponId: held, orderNo: `U-${++seq}`, orderAmountCents: 1000 })).status).toBe(201);
      expect(
        (await send('/redemptions/holds', { userCouponId: heldShort, orderNo: `U-${++seq}`, orderAmountCents: 1000, ttlSeconds: 1 }))
          .status,
      ).toBe(201);
      await new Promise((r) => setTimeout(r, 1100));
      await grab('someone-else', { discount: { thresholdCents: 0, amountCents: 9999 } });

      const res = await request(t.url)
        .get('/me/coupons/usable?orderAmountCents=20000')
        .set(bearer(tokenFor(user)));
      expect(res.status).toBe(200);
      expect(res.body.items.map((i: { userCoupon: { id: string }; discountCents: number }) => [i.userCoupon.id, i.discountCents])).toEqual([
        [bigSooner, 3000],
        [big, 3000],
        [percent, 2000],
        [heldShort, 200],
      ]);
      expect(res.body.items[3].userCoupon.status).toBe('UNUSED');
      const small = await request(t.url).get(`/me/coupons/usable?orderAmountCents=2500&userId=${user}`).set(bearer(serviceToken()));
      expect(small.body.items.map((i: { discountCents: number }) => i.discountCents)).toEqual([2500, 2500, 250, 200]);
      expect([tooHigh, future, used, held, expired].every((id) => !JSON.stringify(small.body).includes(`"id":"${id}"`))).toBe(true);
    });

    it('refuses bad queries with 400 naming the field; a service must name the user, a user only themself', async () => {
      for (const [query, field] of [
        ['', 'orderAmountCents'],
        ['orderAmountCents=-1', 'orderAmountCents'],
        ['orderAmountCents=1e3', 'orderAmountCents'],
        ['orderAmountCents=0x10', 'orderAmountCents'],
        ['orderAmountCents=10&extra=1', 'extra'],
        ['orderAmountCents=10&userId=bad%20id', 'userId'],
      ]) {
        const res = await request(t.url)
          .get(`/me/coupons/usable?${query}`)
          .set(bearer(tokenFor('q')));
        expect([query, res.status, res.body.code]).toEqual([query, 400, 'VALIDATION_FAILED']);
        expect(Object.keys(res.body.details.fields)).toContain(field);
      }
      const service = await request(t.url).get('/me/coupons/usable?orderAmountCents=10').set(bearer(serviceToken()));
      expect([service.status, Object.keys(service.body.details.fields)]).toEqual([400, ['userId']]);
      const other = await request(t.url)
        .get('/me/coupons/usable?orderAmountCents=10&userId=other')
        .set(bearer(tokenFor('q')));
      expect([other.status, other.body.code]).toEqual([403, 'FORBIDDEN']);
      expect((await request(t.url).get('/me/coupons/usable?orderAmountCents=10')).status).toBe(401);
    });

    it('answers a user with 300 coupons in one query, quickly', async () => {
      const coupon = await createCoupon(t.url, { totalStock: 1000, perUserLimit: 1000, discount: { thresholdCents: 0, amountCents: 10 } });
      for (let i = 0; i < 300; i += 50) {
        await Promise.all(
          Array.from({ length: 50 }, () =>
            request(t.url)
              .post(`/coupons/${coupon.id}/grab`)
              .set(bearer(tokenFor('hoarder')))
              .set('Idempotency-Key', newKey()),
          ),
        );
      }
      // One SQL statement for the user's coupons (the templates come from the template cache).
      const statements = jest.spyOn(EntityManager.prototype, 'query');
      const started = performance.now();
      const res = await request(t.url)
        .get('/me/coupons/usable?orderAmountCents=1000')
        .set(bearer(tokenFor('hoarder')));
      const ms = performance.now() - started;
      expect(statements.mock.calls.filter(([q]) => String(q).includes('user_coupon'))).toHaveLength(1);
      statements.mockRestore();
      expect(res.body.items).toHaveLength(300);
      // Generous: the machine is shared; the point is one indexed query, not the clock.
      expect(ms).toBeLessThan(5000);
    });
  });

  describe('GET /coupons', () => {
    it('lists live coupons (not paused, window not ended), soonest grab start first, page by page', async () => {
      const base = Date.now() + 30 * DAY;
      const at = (h: number) => new Date(base + h * HOUR).toISOString();
      const made: { id: string }[] = [];
      for (const h of [5, 1, 3, 2, 4])
        made.push(await createCoupon(t.url, { name: `centre-${h}`, grabStartAt: at(h), grabEndAt: at(h + 100) }));
      const paused = await createCoupon(t.url, { name: 'centre-paused', grabStartAt: at(0), grabEndAt: at(200) });
      await request(t.url).patch(`/admin/coupons/${paused.id}`).set(admin()).send({ status: 'PAUSED' });
      await createCoupon(t.url, {
        name: 'centre-ended',
        grabStartAt: new Date(Date.now() - 2 * HOUR).toISOString(),
        grabEndAt: new Date(Date.now() - HOUR).toISOString(),
      });

      const names: string[] = [];
      let cursor: string | null = null;
      let pages = 0;
      do {
        const res = await request(t.url).get(`/coupons?limit=2${cursor ? `&cursor=${cursor}` : ''}`);
        expect(res.status).toBe(200);
        expect(res.body.items.length).toBeLessThanOrEqual(2);
        names.push(...res.body.items.map((c: { name: string }) => c.name));
        cursor = res.body.nextCursor;
        pages++;
      } while (cursor && pages < 50);
      const centre = names.filter((n) => n.startsWith('centre-'));
      expect(centre).toEqual(['centre-1', 'centre-2', 'centre-3', 'centre-4', 'centre-5']);
      const starts = (await request(t.url).get('/coupons?limit=100')).body.items.map((c: { grabStartAt: string }) =>
        Date.parse(c.grabStartAt),
      );
      expect(starts).toEqual([...starts].sort((a, b) => a - b));
      const one = (await request(t.url).get('/coupons?limit=100')).body.items.find((c: { id: string }) => c.id === made[0].id);
      expect(one).toMatchObject({ id: made[0].id, name: 'centre-5', status: 'ACTIVE', remainingStock: 100, initStock: 100 });
    });

    it('is served from memory: a burst of requests costs the database no query', async () => {
      await request(t.url).get('/coupons');
      // The snapshot is read with Repository.find; every read of the list in this process goes through it.
      const reads = jest.spyOn(Repository.prototype, 'find');
      const started = Date.now();
      await Promise.all(Array.from({ length: 200 }, () => request(t.url).get('/coupons?limit=5')));
      // One read per half COUPON_CACHE_TTL_MS at most: from half of it on, a request starts the background refresh.
      const refreshes = Math.ceil((Date.now() - started) / 150) + 1;
      expect(reads.mock.calls.length).toBeLessThanOrEqual(refreshes);
      expect(reads.mock.calls.length).toBeLessThan(20);
      reads.mockRestore();
      // A change made through this instance shows at once; the snapshot is read again after COUPON_CACHE_TTL_MS.
      const fresh = await createCoupon(t.url, {
        name: 'centre-fresh',
        grabStartAt: new Date(Date.now() + 60 * DAY).toISOString(),
        grabEndAt: new Date(Date.now() + 61 * DAY).toISOString(),
      });
      const list = (await request(t.url).get('/coupons?limit=100')).body.items.map((c: { id: string }) => c.id);
      expect(list).toContain(fresh.id);
      await t.db.query(`UPDATE coupon SET status = 'PAUSED' WHERE id = ?`, [fresh.id]);
      await new Promise((r) => setTimeout(r, 400));
      await request(t.url).get('/coupons?limit=100');
      await new Promise((r) => setTimeout(r, 100));
      const later = (await request(t.url).get('/coupons?limit=100')).body.items.map((c: { id: string }) => c.id);
      expect(later).not.toContain(fresh.id);
    });

    it('answers gzip to a client that accepts it: the same JSON, made again when the stock moves, and Vary: Accept-Encoding', async () => {
      const coupons: { id: string }[] = [];
      for (let i = 0; i < 4; i++) coupons.push(await createCoupon(t.url, { name: `centre-gzip-${i}`, totalStock: 10 }));
      // Raw bytes: supertest's client asks for gzip and decodes it.
      const get = async (path: string, acceptEncoding?: string) => {
        const res = await undici.request(`${t.url}${path}`, {
          headers: acceptEncoding === undefined ? {} : { 'accept-encoding': acceptEncoding },
        });
        const bytes = Buffer.from(await res.body.arrayBuffer());
        return { status: res.statusCode, headers: res.headers, bytes };
      };
      const json = (a: { headers: Record<string, unknown>; bytes: Buffer }) =>
        JSON.parse((a.headers['content-encoding'] === 'gzip' ? gunzipSync(a.bytes) : a.bytes).toString()) as {
          items: { id: string; remainingStock: number }[];
        };

      const plain = await get('/coupons?limit=100');
      expect(plain.bytes.length).toBeGreaterThan(MIN_GZIP_BYTES);
      expect(plain.headers['content-encoding']).toBeUndefined();
      expect(plain.headers.vary).toBe('Accept-Encoding');
      const gz = await get('/coupons?limit=100', 'gzip, deflate, br, zstd');
      expect([gz.status, gz.headers['content-encoding'], gz.headers.vary]).toEqual([200, 'gzip', 'Accept-Encoding']);
      expect(gz.headers['content-type']).toBe('application/json; charset=utf-8');
      expect(Number(gz.headers['content-length'])).toBe(gz.bytes.length);
      expect(gunzipSync(gz.bytes).toString()).toBe(plain.bytes.toString());
      expect(gz.bytes.length).toBeLessThan(plain.bytes.length / 3);
      // What the client refuses, or does not name, it does not get.
      for (const refused of ['gzip;q=0', 'gzip;q=0, *', 'GZIP ; Q=0.0, br', 'identity', 'br', ''])
        expect([refused, (await get('/coupons?limit=100', refused)).headers['content-encoding']]).toEqual([refused, undefined]);
      for (const taken of ['*', 'GZIP', 'br;q=0.5, Gzip;Q=1'])
        expect([taken, (await get('/coupons?limit=100', taken)).headers['content-encoding']]).toEqual([taken, 'gzip']);

      const head = await undici.request(`${t.url}/coupons?limit=100`, { method: 'HEAD', headers: { 'accept-encoding': 'gzip' } });
      expect([head.statusCode, head.headers['content-encoding'], Number(head.headers['content-length'])]).toEqual([
        200,
        'gzip',
        gz.bytes.length,
      ]);
      expect((await head.body.arrayBuffer()).byteLength).toBe(0);

      // A grab through this instance shows at once in the gzip'd list too.
      await grabUserCoupon(t.url, coupons[2].id, 'centre-gzip-user');
      const after = json(await get('/coupons?limit=100', 'gzip'));
      expect(after.items.find((c) => c.id === coupons[2].id)?.remainingStock).toBe(9);
      expect(after.items.find((c) => c.id === coupons[1].id)?.remainingStock).toBe(10);

      // One coupon is a few hundred bytes: not worth compressing, but the answer still varies by encoding.
      const page = await get(`/coupons/${coupons[2].id}`, 'gzip');
      expect(page.bytes.length).toBeLessThan(MIN_GZIP_BYTES);
      expect([page.headers['content-encoding'], page.headers.vary, json(page)]).toEqual([
        undefined,
        'Accept-Encoding',
        expect.objectContaining({ id: coupons[2].id, remainingStock: 9 }),
      ]);
    });

    it('keeps one answer per page shown: a cursor made up per request does not serialise the page again', async () => {
      await request(t.url).get('/coupons?limit=100&cursor=0_1');
      // Every cursor before the first coupon shows the same page; the snapshot itself is read again
      // every half COUPON_CACHE_TTL_MS, which makes new objects to serialise.
      const stringify = jest.spyOn(JSON, 'stringify');
      const reads = jest.spyOn(Repository.prototype, 'find');
      for (let n = 2; n <= 40; n++) expect((await request(t.url).get(`/coupons?limit=100&cursor=0_${n}`)).status).toBe(200);
      const pages = stringify.mock.calls.filter(([v]) => typeof v === 'object' && v !== null && 'items' in v && 'nextCursor' in v);
      const snapshots = reads.mock.calls.length;
      stringify.mockRestore();
      reads.mockRestore();
      expect(pages.length).toBeLessThanOrEqual(snapshots + 1);
      expect(pages.length).toBeLessThan(20);
    });

    it('refuses bad queries with 400 naming the field', async () => {
      for (const [query, field] of [
        ['limit=0', 'limit'],
        ['limit=101', 'limit'],
        ['cursor=abc', 'cursor'],
        ['cursor=1_0', 'cursor'],
        ['cursor=1_9223372036854775808', 'cursor'],
        ['x=1', 'x'],
      ]) {
        const res = await request(t.url).get(`/coupons?${query}`);
        expect([query, res.status, res.body.code]).toEqual([query, 400, 'VALIDATION_FAILED']);
        expect(Object.keys(res.body.details.fields)).toContain(field);
      }
    });
  });
});
