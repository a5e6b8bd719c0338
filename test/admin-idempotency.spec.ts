// Operators' writes without a natural key (a coupon created, stock changed) take an optional
// Idempotency-Key: a retry after a lost answer must not create a second campaign or add the stock twice.
import request from 'supertest';
import { checkInvariants } from '../src/ledger/invariants.js';
import { couponBody, createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, startTestApp, TestApp } from './support/harness.js';

describe('idempotent operator writes', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterEach(async () => {
    expect(await checkInvariants(t.db)).toEqual([]);
  });
  afterAll(() => t.close());

  const admin = () => bearer(adminToken());
  const create = (body: object, key?: string) => {
    const req = request(t.url).post('/admin/coupons').set(admin());
    return (key ? req.set('Idempotency-Key', key) : req).send(body);
  };
  const stock = (couponId: string, delta: number, key?: string) => {
    const req = request(t.url).post(`/admin/coupons/${couponId}/stock`).set(admin());
    return (key ? req.set('Idempotency-Key', key) : req).send({ delta });
  };
  const named = async (name: string) =>
    Number(((await t.db.query(`SELECT COUNT(*) AS n FROM coupon WHERE name = ?`, [name])) as { n: string }[])[0].n);

  it('creates a coupon once per key, repeats in parallel included; the key with another body is 422', async () => {
    const key = newKey('create');
    const body = couponBody({ name: 'Once only', totalStock: 100 });
    const all = await Promise.all(Array.from({ length: 6 }, () => create(body, key)));
    expect(all.map((r) => r.status)).toEqual(Array.from({ length: 6 }, () => 201));
    expect(new Set(all.map((r) => r.body.id)).size).toBe(1);
    expect(all.filter((r) => r.headers['idempotent-replayed'] === 'true')).toHaveLength(5);
    expect(await named('Once only')).toBe(1);
    // The same request with its fields in another order is the same request.
    const reordered = Object.fromEntries(Object.entries(body).reverse());
    const again = await create(reordered, key);
    expect([again.status, again.body.id, again.headers['idempotent-replayed']]).toEqual([201, all[0].body.id, 'true']);
    // So is one that writes its instants otherwise or spells out the defaults it left out.
    const spelled = {
      ...body,
      grabStartAt: body.grabStartAt.replace('.000Z', 'Z').replace('Z', '+00:00'),
      perUserLimit: body.perUserLimit ?? 1,
      stackable: false,
      returnOnRefund: false,
      discount: { type: 'AMOUNT', ...body.discount },
    };
    expect(spelled.grabStartAt).not.toBe(body.grabStartAt);
    const same = await create(spelled, key);
    expect([same.status, same.body.id, same.headers['idempotent-replayed']]).toEqual([201, all[0].body.id, 'true']);
    const other = await create({ ...body, totalStock: 200 }, key);
    expect([other.status, other.body.code, other.body.details]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED', { couponId: all[0].body.id }]);
    // Without a key every request creates.
    await create(couponBody({ name: 'Twice' }));
    await create(couponBody({ name: 'Twice' }));
    expect(await named('Twice')).toBe(2);
  });

  it('answers a repeat of a create as its replay even once the checks it passed would refuse it (a FIXED validity since ended)', async () => {
    const key = newKey('ending');
    const now = Date.now();
    const body = couponBody({
      name: 'Ends soon',
      grabStartAt: new Date(now - 60_000).toISOString(),
      grabEndAt: new Date(now + 3_600_000).toISOString(),
      validity: { type: 'FIXED', startAt: new Date(now - 60_000).toISOString(), endAt: new Date(now + 5000).toISOString() },
    });
    const first = await create(body, key);
    expect(first.status).toBe(201);
    await new Promise((r) => setTimeout(r, now + 5100 - Date.now()));
    const again = await create(body, key);
    expect([again.status, again.body.id, again.headers['idempotent-replayed']]).toEqual([201, first.body.id, 'true']);
  });

  it('changes stock once per key, answering the coupon as it is now, even where applying it again would be refused', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 50 });
    const add = newKey('add');
    const first = await stock(coupon.id, 100, add);
    const repeats = await Promise.all(Array.from({ length: 4 }, () => stock(coupon.id, 100, add)));
    expect([first.status, first.body.remainingStock, first.headers['idempotent-replayed']]).toEqual([200, 150, undefined]);
    expect(repeats.map((r) => [r.status, r.body.remainingStock, r.headers['idempotent-replayed']])).toEqual(
      Array.from({ length: 4 }, () => [200, 150, 'true']),
    );
    // Remove everything, then the same request again: its replay, not 409 INSUFFICIENT_STOCK.
    const all = newKey('remove-all');
    expect((await stock(coupon.id, -150, all)).body.remainingStock).toBe(0);
    const replay = await stock(coupon.id, -150, all);
    expect([replay.status, replay.body.remainingStock, replay.headers['idempotent-replayed']]).toEqual([200, 0, 'true']);
    const other = await stock(coupon.id, -10, add);
    expect([other.status, other.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    const elsewhere = await createCoupon(t.url, { totalStock: 5 });
    expect((await stock(elsewhere.id, 100, add)).body.code).toBe('IDEMPOTENCY_KEY_REUSED');
    const stored = (await t.db.query(`SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, [coupon.id])) as {
      init_stock: string;
      stock: string;
    }[];
    expect(stored).toEqual([{ init_stock: '0', stock: '0' }]);
  });

  it('refuses a malformed key with 400 naming it, and an unknown coupon is 404 with or without one', async () => {
    const bad = await create(couponBody(), 'not a key!');
    expect([bad.status, Object.keys(bad.body.details?.fields ?? {})]).toEqual([400, ['Idempotency-Key']]);
    expect((await stock('987654321', 5, newKey('missing'))).body.code).toBe('COUPON_NOT_FOUND');
  });
});
