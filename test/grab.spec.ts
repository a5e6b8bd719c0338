import { jest } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { GrabService } from '../src/coupon/grab.service.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { couponBody, createCoupon, grabRequest, newKey } from './support/factories.js';
import { checkInvariantsAfterEach } from './support/scoped-invariants.js';
import { adminToken, bearer, burstAgent, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { waitForStatement } from './support/processlist.js';
import { interleaveBefore } from './support/interleave.js';

const HOUR = 3600_000;

describe.each(['grouped', 'per-request'])('grab (GRAB_STRATEGY=%s)', (strategy) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ GRAB_STRATEGY: strategy });
  });
  checkInvariantsAfterEach(() => t.db);
  afterAll(() => t.close());

  const grab = (couponId: string, userId: string, key: string = newKey()) => grabRequest(t.url, couponId, userId, key).agent(burstAgent);
  const rowCount = async (sql: string, params: unknown[] = []) => Number(((await t.db.query(sql, params)) as { n: string }[])[0].n);
  const issuedOf = (couponId: string) => rowCount(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId]);
  const stockOf = async (couponId: string) =>
    (
      (await t.db.query(`SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, [couponId])) as {
        init_stock: string;
        stock: string;
      }[]
    )[0];

  it('2,000 concurrent grabs by 2,000 users on 500 stock issue exactly 500', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 500 });
    const answers = await Promise.all(Array.from({ length: 2000 }, (_, i) => grab(coupon.id, `crowd-${i}`)));
    const byStatus = answers.reduce<Record<string, number>>(
      (acc, r) => ({ ...acc, [`${r.status} ${r.body.code ?? ''}`]: (acc[`${r.status} ${r.body.code ?? ''}`] ?? 0) + 1 }),
      {},
    );
    expect(byStatus).toEqual({ '201 ': 500, '409 SOLD_OUT': 1500 });
    expect(await stockOf(coupon.id)).toEqual({ init_stock: '500', stock: '0' });
    expect(await issuedOf(coupon.id)).toBe(500);
    const winners = answers.filter((r) => r.status === 201).map((r) => r.body.id as string);
    expect(new Set(winners).size).toBe(500);
    expect(
      await rowCount(
        `SELECT COUNT(DISTINCT l.user_coupon_id) AS n FROM user_coupon_state_log l JOIN user_coupon uc ON uc.id = l.user_coupon_id WHERE uc.coupon_id = ? AND l.from_status IS NULL`,
        [coupon.id],
      ),
    ).toBe(500);
  });

  it.each([1, 3])('50 concurrent grabs by one user with limit %i issue exactly that many', async (limit) => {
    const coupon = await createCoupon(t.url, { totalStock: 100, perUserLimit: limit });
    const answers = await Promise.all(Array.from({ length: 50 }, () => grab(coupon.id, `greedy-${limit}`)));
    expect(answers.filter((r) => r.status === 201)).toHaveLength(limit);
    expect(answers.filter((r) => r.status !== 201).every((r) => r.status === 409 && r.body.code === 'USER_LIMIT_REACHED')).toBe(true);
    expect(await issuedOf(coupon.id)).toBe(limit);
    expect((await stockOf(coupon.id)).stock).toBe(String(100 - limit));
  });

  it('a shopper holding the last coupon who grabs again is told SOLD_OUT, first time and after; with stock left, USER_LIMIT_REACHED', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 1, perUserLimit: 1 });
    expect((await grab(coupon.id, 'last-one')).status).toBe(201);
    // The first: no grab was refused SOLD_OUT yet, so the instance's memory does not know and the database decides.
    expect((await grab(coupon.id, 'last-one')).body.code).toBe('SOLD_OUT');
    expect((await grab(coupon.id, 'last-one-other')).body.code).toBe('SOLD_OUT');
    expect((await grab(coupon.id, 'last-one')).body.code).toBe('SOLD_OUT');
    const more = await createCoupon(t.url, { totalStock: 2, perUserLimit: 1 });
    expect((await grab(more.id, 'not-last')).status).toBe(201);
    expect((await grab(more.id, 'not-last')).body.code).toBe('USER_LIMIT_REACHED');
  });

  it('30 concurrent grabs with one key issue one coupon; every answer is that coupon or 409', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const key = newKey('dup');
    const answers = await Promise.all(Array.from({ length: 30 }, () => grab(coupon.id, 'double-clicker', key)));
    expect(await issuedOf(coupon.id)).toBe(1);
    const ids = new Set(answers.filter((r) => r.status === 201).map((r) => r.body.id));
    expect(ids.size).toBe(1);
    expect(answers.every((r) => r.status === 201 || r.status === 409)).toBe(true);
    expect(answers.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
  });

  it('replays a finished grab with the same body and Idempotent-Replayed, refuses the key for another coupon, and answers GET /grabs/:key', async () => {
    const a = await createCoupon(t.url, { totalStock: 5 });
    const b = await createCoupon(t.url, { totalStock: 5 });
    const key = newKey('replay');
    const first = await grab(a.id, 'replayer', key);
    expect(first.status).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(first.body).toMatchObject({ couponId: a.id, userId: 'replayer', status: 'UNUSED', source: 'GRAB', usedAt: null });
    const again = await grab(a.id, 'replayer', key);
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toEqual(first.body);
    const other = await grab(b.id, 'replayer', key);
    expect(other.status).toBe(422);
    expect(other.body.code).toBe('IDEMPOTENCY_KEY_REUSED');
    expect(await issuedOf(b.id)).toBe(0);

    const found = await request(t.url)
      .get(`/grabs/${key}`)
      .set(bearer(tokenFor('replayer')));
    expect(found.status).toBe(200);
    expect(found.body).toEqual(first.body);
    const notMine = await request(t.url)
      .get(`/grabs/${key}`)
      .set(bearer(tokenFor('someone-else')));
    expect(notMine.status).toBe(404);
    expect(notMine.body.code).toBe('GRAB_NOT_FOUND');
  });

  it('a replay repeats the first answer after the coupon was used, while the reads show it USED', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    const key = newKey('used');
    const first = await grab(coupon.id, 'user-then-replay', key);
    expect(first.status).toBe(201);
    const used = await request(t.url)
      .post('/redemptions')
      .set(bearer(serviceToken()))
      .send({ userCouponId: first.body.id, orderNo: `order-${key}`, orderAmountCents: 100_000, userId: 'user-then-replay' });
    expect(used.status).toBe(201);
    const again = await grab(coupon.id, 'user-then-replay', key);
    expect([again.status, again.headers['idempotent-replayed']]).toEqual([201, 'true']);
    expect(again.body).toEqual(first.body);
    const now = await request(t.url)
      .get(`/grabs/${key}`)
      .set(bearer(tokenFor('user-then-replay')));
    expect(now.body).toEqual({ ...first.body, status: 'USED', usedAt: used.body.usedAt });
  });

  it('a replay of a successful grab still answers after the coupon sold out', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 1 });
    const key = newKey('last');
    expect((await grab(coupon.id, 'last-one', key)).status).toBe(201);
    expect((await grab(coupon.id, 'too-late')).body.code).toBe('SOLD_OUT');
    const again = await grab(coupon.id, 'last-one', key);
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
  });

  it('refuses grabs outside the window, on paused and unknown coupons, with a bad key or no token, writing nothing', async () => {
    const now = Date.now();
    const notStarted = await createCoupon(t.url, {
      grabStartAt: new Date(now + HOUR).toISOString(),
      grabEndAt: new Date(now + 2 * HOUR).toISOString(),
    });
    const ended = await createCoupon(t.url, {
      grabStartAt: new Date(now - 2 * HOUR).toISOString(),
      grabEndAt: new Date(now - HOUR).toISOString(),
    });
    const paused = await createCoupon(t.url);
    const patched = await request(t.url).patch(`/admin/coupons/${paused.id}`).set(bearer(adminToken())).send({ status: 'PAUSED' });
    expect(patched.status).toBe(200);
    expect(patched.body.status).toBe('PAUSED');
    const before = await rowCount(`SELECT COUNT(*) AS n FROM user_coupon`);

    expect((await grab(notStarted.id, 'u1')).body).toMatchObject({ code: 'GRAB_NOT_STARTED' });
    expect((await grab(ended.id, 'u1')).body).toMatchObject({ code: 'GRAB_ENDED' });
    expect((await grab(paused.id, 'u1')).body).toMatchObject({ code: 'COUPON_PAUSED' });
    const unknown = await grab('999999999', 'u1');
    expect([unknown.status, unknown.body.code]).toEqual([404, 'COUPON_NOT_FOUND']);
    const badId = await grab('abc', 'u1');
    expect([badId.status, badId.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    for (const key of ['', 'has space', 'x'.repeat(129), 'ünïcode']) {
      const res = await request(t.url)
        .post(`/coupons/${paused.id}/grab`)
        .set(bearer(tokenFor('u1')))
        .set('Idempotency-Key', key);
      expect([res.status, res.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    }
    const noKey = await request(t.url)
      .post(`/coupons/${notStarted.id}/grab`)
      .set(bearer(tokenFor('u1')));
    expect([noKey.status, noKey.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    const noToken = await request(t.url).post(`/coupons/${notStarted.id}/grab`).set('Idempotency-Key', newKey());
    expect([noToken.status, noToken.body.code]).toEqual([401, 'UNAUTHENTICATED']);

    const resumed = await request(t.url).patch(`/admin/coupons/${paused.id}`).set(bearer(adminToken())).send({ status: 'ACTIVE' });
    expect(resumed.body.status).toBe('ACTIVE');
    expect((await grab(paused.id, 'u1')).status).toBe(201);
    expect(await rowCount(`SELECT COUNT(*) AS n FROM user_coupon`)).toBe(before + 1);
  });

  it('treats user ids and keys as case-sensitive everywhere: alice and ALICE are two users, k and K two keys', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10, perUserLimit: 2 });
    const ids = [];
    for (const [user, key] of [
      ['case-alice', 'case-k'],
      ['CASE-ALICE', 'case-k'],
      ['case-alice', 'CASE-K'],
    ]) {
      const res = await grab(coupon.id, user, key);
      expect([user, key, res.status, res.headers['idempotent-replayed']]).toEqual([user, key, 201, undefined]);
      ids.push(res.body.id);
    }
    expect(new Set(ids).size).toBe(3);
    expect((await grab(coupon.id, 'CASE-ALICE')).status).toBe(201);
    expect((await grab(coupon.id, 'CASE-ALICE')).body.code).toBe('USER_LIMIT_REACHED');
    const upper = await request(t.url)
      .get('/me/coupons')
      .set(bearer(tokenFor('CASE-ALICE')));
    expect(upper.body.items.every((i: { userId: string }) => i.userId === 'CASE-ALICE')).toBe(true);
    expect(
      (
        await request(t.url)
          .get(`/me/coupons/${ids[0]}`)
          .set(bearer(tokenFor('CASE-ALICE')))
      ).status,
    ).toBe(404);
  });

  it('validates PATCH bodies: null status refused, null rateLimitPerSecond resets to the default', async () => {
    const coupon = await createCoupon(t.url, { rateLimitPerSecond: 50 });
    const patch = (body: unknown) =>
      request(t.url)
        .patch(`/admin/coupons/${coupon.id}`)
        .set(bearer(adminToken()))
        .send(body as object);
    for (const body of [{ status: null, rateLimitPerSecond: 1000 }, { status: 'DELETED' }, {}, { rateLimitPerSecond: 0 }]) {
      const res = await patch(body);
      expect([JSON.stringify(body), res.status, res.body.code]).toEqual([JSON.stringify(body), 400, 'VALIDATION_FAILED']);
    }
    expect((await patch({ rateLimitPerSecond: null })).body).toMatchObject({ status: 'ACTIVE', rateLimitPerSecond: null });
  });

  it('makes stock added to a sold-out coupon grabbable at once', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 1 });
    expect((await grab(coupon.id, 's1')).status).toBe(201);
    expect((await grab(coupon.id, 's2')).body.code).toBe('SOLD_OUT');
    const added = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: 2 });
    expect(added.status).toBe(200);
    expect(added.body).toMatchObject({ initStock: 3, remainingStock: 2 });
    expect((await grab(coupon.id, 's2')).status).toBe(201);
  });

  it('refuses to remove more stock than remains, changing nothing', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 3 });
    expect((await grab(coupon.id, 'r1')).status).toBe(201);
    const tooMuch = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: -3 });
    // Named by what remains, as the operator's screen shows it (not the 3 ever created).
    expect([tooMuch.status, tooMuch.body.code, tooMuch.body.message, tooMuch.body.details]).toEqual([
      409,
      'INSUFFICIENT_STOCK',
      'Cannot remove 3 units: only 2 remain',
      { delta: -3, remainingStock: 2 },
    ]);
    expect(await stockOf(coupon.id)).toEqual({ init_stock: '3', stock: '2' });
    const ok = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: -2 });
    expect(ok.body).toMatchObject({ initStock: 1, remainingStock: 0 });
    for (const body of [{ delta: 0 }, { delta: 1.5 }, { delta: '1' }, {}, { delta: 1, extra: true }]) {
      const bad = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send(body);
      expect([bad.status, bad.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    }
  });

  it('refuses a removal that would take the total stock below zero, even with that much remaining after a hand edit', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    // More remaining than was ever created: reconciliation reports it as STOCK_MISMATCH.
    await t.db.query(`UPDATE coupon_stock SET stock = stock + 3 WHERE coupon_id = ?`, [coupon.id]);
    const below = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: -7 });
    expect([below.status, below.body.code, below.body.details]).toEqual([409, 'INSUFFICIENT_STOCK', { delta: -7, initStock: 5 }]);
    expect(await stockOf(coupon.id)).toEqual({ init_stock: '5', stock: '8' });
    await t.db.query(`UPDATE coupon_stock SET stock = stock - 3 WHERE coupon_id = ?`, [coupon.id]);
    const all = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: -5 });
    expect([all.status, all.body.initStock, all.body.remainingStock]).toEqual([200, 0, 0]);
  });

  it('adds stock to a coupon whose remaining stock a hand edit left negative, however little it adds', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    await t.db.query(`UPDATE coupon_stock SET stock = -2 WHERE coupon_id = ?`, [coupon.id]);
    const add = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: 1 });
    expect(add.status).toBe(200);
    expect(await stockOf(coupon.id)).toEqual({ init_stock: '6', stock: '-1' });
    await t.db.query(`UPDATE coupon_stock SET stock = init_stock WHERE coupon_id = ?`, [coupon.id]);
  });

  it('computes validity from the template: N days from issue, or the fixed window', async () => {
    const relative = await createCoupon(t.url, { validity: { type: 'RELATIVE', days: 3 } });
    const start = new Date(Date.now() + 86_400_000).toISOString();
    const end = new Date(Date.now() + 5 * 86_400_000).toISOString();
    const fixed = await createCoupon(t.url, { validity: { type: 'FIXED', startAt: start, endAt: end } });
    const r = (await grab(relative.id, 'v1')).body;
    expect(Date.parse(r.expiresAt) - Date.parse(r.issuedAt)).toBe(3 * 86_400_000);
    expect(r.validFrom).toBe(r.issuedAt);
    const f = (await grab(fixed.id, 'v1')).body;
    expect([f.validFrom, f.expiresAt]).toEqual([start, end]);
  });

  it('never hands out a coupon born EXPIRED: such templates are refused, and grabbing ends with the validity, even for a grab already queued', async () => {
    const fixed = (startMs: number, endMs: number) => ({
      type: 'FIXED' as const,
      startAt: new Date(Date.now() + startMs).toISOString(),
      endAt: new Date(Date.now() + endMs).toISOString(),
    });
    const create = (body: object) => request(t.url).post('/admin/coupons').set(bearer(adminToken())).send(couponBody(body));
    const passed = await create({ validity: fixed(-2 * HOUR, -HOUR) });
    expect([passed.status, passed.body.details]).toEqual([400, { fields: { 'validity.endAt': ['has already passed'] } }]);
    const beforeGrabbing = await create({
      grabStartAt: new Date(Date.now() + 2 * HOUR).toISOString(),
      grabEndAt: new Date(Date.now() + 3 * HOUR).toISOString(),
      validity: fixed(0, HOUR),
    });
    expect([beforeGrabbing.status, beforeGrabbing.body.details]).toEqual([
      400,
      { fields: { 'validity.endAt': ['must be after grabStartAt'] } },
    ]);

    // Valid for a few seconds more (room for the grabs before the end on a loaded machine), grabbable for an hour.
    const validity = fixed(-HOUR, 8000);
    const endAt = validity.endAt;
    const coupon = await createCoupon(t.url, { grabEndAt: new Date(Date.now() + HOUR).toISOString(), validity });
    const listed = async () =>
      ((await request(t.url).get('/coupons?limit=100')).body.items as { id: string }[]).some((c) => c.id === coupon.id);
    const early = await grab(coupon.id, 'validity-early');
    expect([early.status, early.body.status]).toEqual([201, 'UNUSED']);
    expect(await listed()).toBe(true);

    // A grab admitted before the end that reaches the stock row only after it: refused, not issued EXPIRED.
    // The row is locked shortly before the end, so the wait stays under DB_LOCK_WAIT_TIMEOUT_SECONDS.
    await new Promise((r) => setTimeout(r, Date.parse(endAt) - Date.now() - 3000));
    const blocker = t.db.createQueryRunner();
    await blocker.startTransaction();
    await blocker.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ? FOR UPDATE`, [coupon.id]);
    const queued = grab(coupon.id, 'validity-queued').then((r) => r);
    // Waiting on the row (grouped: its SELECT ... FOR UPDATE; per request: its UPDATE).
    await waitForStatement(t.db, '%coupon_stock%');
    await new Promise((r) => setTimeout(r, Date.parse(endAt) - Date.now() + 100));
    await blocker.commitTransaction();
    await blocker.release();
    const refused = await queued;
    expect([refused.status, refused.body.code, refused.body.details?.validityEndedAt]).toEqual([409, 'GRAB_ENDED', endAt]);

    const late = await grab(coupon.id, 'validity-late');
    expect([late.status, late.body.code, late.body.details.validityEndedAt]).toEqual([409, 'GRAB_ENDED', endAt]);
    expect(await issuedOf(coupon.id)).toBe(1);
    // The public list is cached for COUPON_CACHE_TTL_MS, but drops a coupon whose grabbing ended as it serves.
    expect(await listed()).toBe(false);
  });

  it('shows admins the coupon with counts, and the public its fields', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 4 });
    await grab(coupon.id, 'c1');
    await grab(coupon.id, 'c2');
    const admin = await request(t.url).get(`/admin/coupons/${coupon.id}`).set(bearer(adminToken()));
    expect(admin.body).toMatchObject({
      id: coupon.id,
      initStock: 4,
      remainingStock: 2,
      counts: { issued: 2, issuedFromStock: 2, unused: 2, used: 0, expired: 0, void: 0 },
    });
    const pub = await request(t.url).get(`/coupons/${coupon.id}`);
    expect(pub.status).toBe(200);
    expect(pub.body).toMatchObject({ id: coupon.id, remainingStock: 2, discount: { thresholdCents: 10000, amountCents: 1000 } });
    expect(
      (
        await request(t.url)
          .get(`/admin/coupons/${coupon.id}`)
          .set(bearer(tokenFor('c1')))
      ).status,
    ).toBe(403);
    expect((await request(t.url).get('/coupons/424242424242')).body.code).toBe('COUPON_NOT_FOUND');
  });

  it.each([
    ['the coupon', (id: string) => `/admin/coupons/${id}`, (body: Record<string, unknown>) => body],
    ['the list', (id: string) => `/admin/coupons?q=${id}`, (body: Record<string, unknown>) => (body.items as Record<string, unknown>[])[0]],
  ])(
    'shows admins %s as one moment: a grab committed between reading the stock and the counts keeps invariant 1',
    async (_, path, pick) => {
      const coupon = await createCoupon(t.url, { totalStock: 4 });
      await grab(coupon.id, 'moment-1');
      let grabbed = 0;
      const between = interleaveBefore(
        t.app.get(DataSource),
        (sql) => sql.includes('COUNT(*) AS n') && sql.includes('FROM user_coupon uc'),
        async () => (grabbed = (await grab(coupon.id, 'moment-2')).status),
      );
      let during: Record<string, unknown>;
      try {
        during = pick((await request(t.url).get(path(coupon.id)).set(bearer(adminToken()))).body as Record<string, unknown>);
      } finally {
        between.restore();
      }
      expect([between.ran, grabbed]).toEqual([1, 201]);
      expect(during).toMatchObject({ id: coupon.id, initStock: 4, remainingStock: 3, counts: { issued: 1, issuedFromStock: 1 } });
      const after = pick((await request(t.url).get(path(coupon.id)).set(bearer(adminToken()))).body as Record<string, unknown>);
      expect(after).toMatchObject({ remainingStock: 2, counts: { issued: 2, issuedFromStock: 2 } });
    },
  );

  it("lists my coupons newest first with cursor pagination and a status filter, and hides other users' coupons", async () => {
    const coupons = await Promise.all([1, 2, 3].map(() => createCoupon(t.url, { totalStock: 5 })));
    const mine: string[] = [];
    for (const c of coupons) mine.push((await grab(c.id, 'lister')).body.id);
    const theirs = (await grab(coupons[0].id, 'stranger')).body.id as string;
    const me = bearer(tokenFor('lister'));
    const p1 = await request(t.url).get('/me/coupons?limit=2').set(me);
    expect(p1.status).toBe(200);
    expect(p1.body.items.map((i: { id: string }) => i.id)).toEqual([mine[2], mine[1]]);
    const p2 = await request(t.url).get(`/me/coupons?limit=2&cursor=${p1.body.nextCursor}`).set(me);
    expect(p2.body).toEqual({ items: [expect.objectContaining({ id: mine[0] })], nextCursor: null });
    expect((await request(t.url).get('/me/coupons?status=USED').set(me)).body.items).toEqual([]);
    expect((await request(t.url).get('/me/coupons?status=UNUSED').set(me)).body.items).toHaveLength(3);
    for (const q of ['limit=0', 'limit=101', 'limit=x', 'status=NOPE', 'cursor=abc', 'other=1']) {
      const bad = await request(t.url).get(`/me/coupons?${q}`).set(me);
      expect([q, bad.status, bad.body.code]).toEqual([q, 400, 'VALIDATION_FAILED']);
    }
    expect((await request(t.url).get(`/me/coupons/${mine[0]}`).set(me)).status).toBe(200);
    const hidden = await request(t.url).get(`/me/coupons/${theirs}`).set(me);
    expect([hidden.status, hidden.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
  });
});

describe('a duplicate key whose first grab the lookup does not see yet', () => {
  // One node never answers this: a duplicate key is reported only once the first grab committed, and
  // the lookup after it then finds the row. A read that lags the write (a replica behind its primary)
  // does not, and is simulated here by that one lookup answering nothing; the database is the real one.
  it('is 409 IDEMPOTENCY_IN_PROGRESS, takes no stock, and the retry is the replay', async () => {
    const t = await startTestApp({ GRAB_STRATEGY: 'per-request' });
    try {
      const coupon = await createCoupon(t.url, { totalStock: 5 });
      const key = newKey('lagging');
      const first = await grabRequest(t.url, coupon.id, 'lagging-user', key);
      expect(first.status).toBe(201);
      const lookup = jest.spyOn(GrabService.prototype, 'byKey').mockResolvedValueOnce(null);
      let second: request.Response;
      let lookups: number;
      try {
        second = await grabRequest(t.url, coupon.id, 'lagging-user', key);
      } finally {
        lookups = lookup.mock.calls.length;
        lookup.mockRestore();
      }
      expect(lookups).toBe(1);
      expect([second.status, second.body.code, second.body.details]).toEqual([409, 'IDEMPOTENCY_IN_PROGRESS', { idempotencyKey: key }]);
      const rows = (await t.db.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ?`, [coupon.id])) as { stock: string }[];
      expect(rows[0].stock).toBe('4');
      expect(await checkInvariants(t.db)).toEqual([]);
      const retry = await grabRequest(t.url, coupon.id, 'lagging-user', key);
      expect([retry.status, retry.headers['idempotent-replayed'], retry.body]).toEqual([201, 'true', first.body]);
    } finally {
      await t.close();
    }
  });
});
