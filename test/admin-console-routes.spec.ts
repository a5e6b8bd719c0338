import { jest } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { COUNTING_READS } from '../src/coupon/coupon.service.js';
import { GrabSeries, SERIES_SECONDS } from '../src/coupon/grab-series.js';
import { createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';

describe('GrabSeries (in-memory counters)', () => {
  const T0 = 1_800_000_000_000;

  it('counts outcomes per second and answers a window ending at the current second', () => {
    const s = new GrabSeries();
    s.record('1', 'ISSUED', T0);
    s.record('1', 'ISSUED', T0 + 999);
    s.record('1', 'SOLD_OUT', T0 + 2000);
    s.record('2', 'ISSUED', T0);
    const w = s.read('1', 10, T0 + 2500);
    expect(w.from).toBe(T0 / 1000 - 7);
    expect(w.outcomes.ISSUED).toEqual([0, 0, 0, 0, 0, 0, 0, 2, 0, 0]);
    expect(w.outcomes.SOLD_OUT).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    expect(s.read('3', 10, T0).outcomes).toEqual({});
  });

  it('forgets seconds older than the window when the ring comes round again', () => {
    const s = new GrabSeries();
    s.record('1', 'ISSUED', T0);
    s.record('1', 'ISSUED', T0 + SERIES_SECONDS * 1000);
    const w = s.read('1', SERIES_SECONDS, T0 + SERIES_SECONDS * 1000);
    expect(w.outcomes.ISSUED.reduce((a, b) => a + b, 0)).toBe(1);
    expect(w.outcomes.ISSUED[SERIES_SECONDS - 1]).toBe(1);
    expect(s.read('1', 10, T0 + (SERIES_SECONDS + 20) * 1000).outcomes).toEqual({});
  });

  it('keeps at most 1000 coupons, dropping the one idle longest', () => {
    const s = new GrabSeries();
    for (let i = 0; i < 1000; i++) s.record(String(i), 'ISSUED', T0 + (i === 0 ? 5000 : 0));
    s.record('new', 'ISSUED', T0 + 6000);
    expect(s.read('0', 10, T0 + 6000).outcomes.ISSUED).toBeDefined();
    expect(s.read('1', 10, T0 + 6000).outcomes).toEqual({});
    expect(s.read('new', 10, T0 + 6000).outcomes.ISSUED).toBeDefined();
  });
});

describe('admin routes the console reads', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());
  const admin = (path: string) => request(t.url).get(path).set(bearer(adminToken()));
  const grab = (couponId: string, userId: string) =>
    request(t.url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor(userId)))
      .set('Idempotency-Key', newKey());

  it('reads coupons with their counts at most COUNTING_READS at a time per instance, the rest waiting without a connection', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    const ds = t.app.get(DataSource);
    const create = ds.createQueryRunner.bind(ds);
    let open = 0;
    let most = 0;
    const spy = jest.spyOn(ds, 'createQueryRunner').mockImplementation((...args) => {
      const runner = create(...args);
      most = Math.max(most, ++open);
      const release = runner.release.bind(runner);
      runner.release = () => {
        open--;
        return release();
      };
      return runner;
    });
    try {
      const answers = await Promise.all(
        Array.from({ length: 8 }, (_, i) => admin(i % 2 ? `/admin/coupons/${coupon.id}` : '/admin/coupons?limit=5')),
      );
      expect(answers.map((a) => a.status)).toEqual(Array(8).fill(200));
      expect(spy.mock.calls.length).toBe(8);
      expect(most).toBe(COUNTING_READS);
    } finally {
      spy.mockRestore();
    }
  });

  it('a coupon whose status is none of the lifecycle (set by hand) is issued but counted under no status, not as a key of its own', async () => {
    const c = await createCoupon(t.url, { name: 'bogus status', totalStock: 5 });
    const res = await grab(c.id, 'bogus-holder');
    expect(res.status).toBe(201);
    await t.db.query(`UPDATE user_coupon SET status = 'BOGUS' WHERE id = ?`, [res.body.id]);
    try {
      const view = await admin(`/admin/coupons/${c.id}`);
      expect([view.status, view.body.counts]).toEqual([
        200,
        { issued: 1, issuedFromStock: 1, unused: 0, locked: 0, used: 0, expired: 0, void: 0 },
      ]);
      // A trailing space the column's collation pads away: the status it reads as.
      await t.db.query(`UPDATE user_coupon SET status = 'UNUSED ' WHERE id = ?`, [res.body.id]);
      expect((await admin(`/admin/coupons/${c.id}`)).body.counts).toEqual({
        issued: 1,
        issuedFromStock: 1,
        unused: 1,
        locked: 0,
        used: 0,
        expired: 0,
        void: 0,
      });
    } finally {
      // Put back for the invariant checks after the test.
      await t.db.query(`UPDATE user_coupon SET status = 'UNUSED' WHERE id = ?`, [res.body.id]);
    }
  });

  it('GET /admin/coupons lists newest first with stock and counts, paged by cursor', async () => {
    const a = await createCoupon(t.url, { name: 'first', totalStock: 5 });
    const b = await createCoupon(t.url, { name: 'second', totalStock: 7 });
    expect((await grab(b.id, 'lister')).status).toBe(201);
    const first = await admin('/admin/coupons?limit=1');
    expect(first.status).toBe(200);
    expect(first.body.items).toHaveLength(1);
    expect(first.body.items[0]).toMatchObject({
      id: b.id,
      name: 'second',
      initStock: 7,
      remainingStock: 6,
      counts: { issued: 1, unused: 1 },
    });
    const next = await admin(`/admin/coupons?limit=1&cursor=${first.body.nextCursor}`);
    expect(next.body.items.map((c: { id: string }) => c.id)).toContain(a.id);
    expect((await admin('/admin/coupons?limit=0')).body.code).toBe('VALIDATION_FAILED');
    expect(
      (
        await request(t.url)
          .get('/admin/coupons')
          .set(bearer(tokenFor('lister')))
      ).status,
    ).toBe(403);
  });

  it('GET /admin/coupons?q= finds coupons by a part of their name (any case, % and _ as themselves) or by id, paged', async () => {
    const tag = `S${Date.now()}`;
    const made = [];
    for (const name of [`${tag} Double 11 满100减10`, `${tag} double 11 VIP`, `${tag} 100% off`, `${tag} 10_off`, 'unrelated'])
      made.push(await createCoupon(t.url, { name }));
    const found = async (q: string, limit = 20) => {
      const names: string[] = [];
      let cursor: string | null = null;
      do {
        const res: request.Response = await admin(
          `/admin/coupons?limit=${limit}&q=${encodeURIComponent(q)}${cursor ? `&cursor=${cursor}` : ''}`,
        );
        expect(res.status).toBe(200);
        names.push(...res.body.items.map((c: { name: string }) => c.name));
        cursor = res.body.nextCursor;
      } while (cursor);
      return names;
    };
    // Newest first, a page at a time.
    expect(await found(`${tag} DOUBLE 11`, 1)).toEqual([`${tag} double 11 VIP`, `${tag} Double 11 满100减10`]);
    expect(await found('满100')).toEqual([`${tag} Double 11 满100减10`]);
    expect(await found(`${tag} 100%`)).toEqual([`${tag} 100% off`]);
    expect(await found(`${tag} 10_`)).toEqual([`${tag} 10_off`]);
    expect(await found(`${tag} 1%f`)).toEqual([]);
    expect(await found(made[4].id)).toContain('unrelated');
    expect(await found(`${tag}-nothing`)).toEqual([]);
    for (const bad of ['', '\u202e', 'x'.repeat(201)]) {
      const res = await admin(`/admin/coupons?q=${encodeURIComponent(bad)}`);
      expect([res.status, res.body.code, Object.keys(res.body.details?.fields ?? {})]).toEqual([400, 'VALIDATION_FAILED', ['q']]);
    }
  });

  it('a cursor above the largest id (2^63-1) is 400, as the same id in a path is', async () => {
    const over = await admin('/admin/coupons?cursor=9223372036854775808');
    expect([over.status, over.body.code, Object.keys(over.body.details?.fields ?? {})]).toEqual([400, 'VALIDATION_FAILED', ['cursor']]);
    expect((await admin('/admin/coupons/9223372036854775808/series')).status).toBe(400);
    expect((await admin('/admin/coupons?cursor=9223372036854775807')).status).toBe(200);
  });

  it('GET /admin/coupons/:id/series gives remaining stock and this second’s outcomes', async () => {
    const c = await createCoupon(t.url, { totalStock: 2 });
    const answers = await Promise.all(['s1', 's2', 's3'].map((u) => grab(c.id, u)));
    expect(answers.map((r) => r.status).sort()).toEqual([201, 201, 409]);
    const res = await admin(`/admin/coupons/${c.id}/series?seconds=30`);
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ couponId: c.id, status: 'ACTIVE', initStock: 2, remainingStock: 0, seconds: 30 });
    const total = (o: string) => ((res.body.outcomes[o] ?? []) as number[]).reduce((x, y) => x + y, 0);
    expect(total('ISSUED')).toBe(2);
    expect(total('SOLD_OUT')).toBe(1);
    expect(Date.parse(res.body.from)).toBeLessThanOrEqual(Date.now() - 29_000);
    expect((await admin(`/admin/coupons/${c.id}/series?seconds=301`)).status).toBe(400);
    expect((await admin('/admin/coupons/999999/series')).body.code).toBe('COUPON_NOT_FOUND');
    expect(
      (
        await request(t.url)
          .get(`/admin/coupons/${c.id}/series`)
          .set(bearer(tokenFor('s1')))
      ).status,
    ).toBe(403);
  });

  it('GET /admin/users/:userId/coupons shows that user’s coupons as /me/coupons does', async () => {
    const c = await createCoupon(t.url, { totalStock: 3 });
    expect((await grab(c.id, 'Bob.1')).status).toBe(201);
    const mine = await request(t.url)
      .get('/me/coupons')
      .set(bearer(tokenFor('Bob.1')));
    const theirs = await admin('/admin/users/Bob.1/coupons');
    expect(theirs.status).toBe(200);
    expect(theirs.body).toEqual(mine.body);
    expect((await admin('/admin/users/bob.1/coupons')).body.items).toEqual([]);
    expect((await admin('/admin/users/Bob.1/coupons?status=USED')).body.items).toEqual([]);
    const bad = await admin(`/admin/users/${'x'.repeat(65)}/coupons`);
    expect(bad.status).toBe(400);
    expect(bad.body.details.fields.userId).toBeDefined();
  });

  it('GET /admin/user-coupons?userId= answers the same page for any user id, `.` and `..` included', async () => {
    const c = await createCoupon(t.url, { totalStock: 5 });
    for (const userId of ['Carol', '.', '..']) expect((await grab(c.id, userId)).status).toBe(201);
    for (const userId of ['Carol', '.', '..']) {
      const mine = await request(t.url)
        .get('/me/coupons')
        .set(bearer(tokenFor(userId)));
      const theirs = await admin(`/admin/user-coupons?userId=${encodeURIComponent(userId)}`);
      expect(theirs.status).toBe(200);
      expect(theirs.body.items).toHaveLength(1);
      expect(theirs.body).toEqual(mine.body);
    }
    expect((await admin('/admin/user-coupons?userId=Carol')).body).toEqual((await admin('/admin/users/Carol/coupons')).body);
    expect((await admin('/admin/user-coupons?userId=..&status=USED')).body.items).toEqual([]);
    expect((await admin('/admin/user-coupons?userId=nobody')).body).toEqual({ items: [], nextCursor: null });
    for (const query of ['', '?status=UNUSED', `?userId=${'x'.repeat(65)}`, '?userId=a%20b', '?userId=a&userId=b']) {
      const bad = await admin(`/admin/user-coupons${query}`);
      expect([query, bad.status, bad.body.code, Object.keys(bad.body.details?.fields ?? {})]).toEqual([
        query,
        400,
        'VALIDATION_FAILED',
        ['userId'],
      ]);
    }
  });

  it('GET /admin/user-coupons pages by cursor as the path form does', async () => {
    const coupons = await Promise.all([1, 2, 3].map(() => createCoupon(t.url, { totalStock: 1 })));
    for (const c of coupons) expect((await grab(c.id, '..')).status).toBe(201);
    const first = await admin('/admin/user-coupons?userId=..&limit=2');
    expect(first.body.items).toHaveLength(2);
    expect(first.body.nextCursor).toEqual(expect.any(String));
    const rest = await admin(`/admin/user-coupons?userId=..&limit=2&cursor=${first.body.nextCursor as string}`);
    const all = [...first.body.items, ...rest.body.items] as { couponId: string }[];
    expect(all.map((uc) => uc.couponId).filter((id) => coupons.some((c) => c.id === id))).toEqual(coupons.map((c) => c.id).reverse());
  });
});
