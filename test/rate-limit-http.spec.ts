import request from 'supertest';
import { createCoupon, newKey } from './support/factories.js';
import { checkInvariantsAfterEach } from './support/scoped-invariants.js';
import { adminToken, bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { RateLimitService } from '../src/rate-limit/rate-limit.service.js';
import { grabBurst, issuedCount, mostAdmitted, recordDecisions, warmCoupon } from './rate-limit.helpers.js';

describe('grab route behind the rate limiter, in-memory buckets', () => {
  let t: TestApp;
  beforeAll(async () => {
    // A long template cache: the grab reads the coupon before asking the limiter, and a reload on
    // every expiry would pace the burst by the database instead of by the limiter.
    t = await startTestApp({ RATE_LIMIT_ENABLED: 'true', RATE_LIMIT_PER_USER_PER_SECOND: '5', COUPON_CACHE_TTL_MS: '60000' });
  });
  checkInvariantsAfterEach(() => t.db);
  afterAll(() => t.close());

  it('a burst of 2,000 grabs at 200/s admits the 200 of the bucket, then 200/s; the rest get 429 and leave no rows', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5000, rateLimitPerSecond: 200 });
    const warmUps = await warmCoupon([t.url], coupon.id);
    const rec = recordDecisions(t.app.get(RateLimitService));
    const b = await grabBurst([t.url], coupon.id, 2000, (i) => `burst-${i}`);
    rec.stop();
    expect(b.other).toEqual([]);
    expect(b.admitted + b.rateLimited).toBe(2000);
    expect(b.badRetryAfter).toBe(0);
    expect(await issuedCount(t.db, coupon.id)).toBe(b.admitted + warmUps);
    expect(rec.decisions.filter((d) => d.admitted)).toHaveLength(b.admitted);
    // A token bucket of 200 refilled at 200/s admits the first 200 that come, and at most
    // 200 + 200/s x t in any t seconds. Tolerance: +2 for timer rounding.
    const start = rec.decisions[0].at;
    const firstSecond = rec.decisions.filter((d) => d.at - start < 1000);
    const admittedFirstSecond = firstSecond.filter((d) => d.admitted).length;
    const span = (firstSecond[firstSecond.length - 1].at - start) / 1000;
    const firstRefusal = rec.decisions.findIndex((d) => !d.admitted);
    expect(firstRefusal === -1 || firstRefusal >= 200).toBe(true);
    expect(admittedFirstSecond).toBeLessThanOrEqual(200 + Math.ceil(200 * span) + 2);
    expect(b.admitted).toBeLessThanOrEqual(200 + Math.ceil(200 * b.seconds) + 2);
    console.log(
      `burst of 2000 at 200/s: ${firstRefusal === -1 ? 'no refusal' : `first refusal after ${firstRefusal} admissions`}; ${admittedFirstSecond} of ${firstSecond.length} admitted in the first second of decisions; ` +
        `${b.admitted} admitted (201) and ${b.rateLimited} refused (429) in all, in ${b.seconds.toFixed(1)} s`,
    );
  });

  it('one user gets RATE_LIMIT_PER_USER_PER_SECOND grabs through and 429 with limit "user" for the rest', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100, perUserLimit: 50, rateLimitPerSecond: 100 });
    const b = await grabBurst([t.url], coupon.id, 20, () => 'one-script');
    expect(b.admitted).toBeGreaterThanOrEqual(5);
    expect(b.admitted).toBeLessThanOrEqual(mostAdmitted(5, b.seconds));
    expect(b.rateLimited).toBe(20 - b.admitted);
    expect(b.limits).toEqual(['user']);
    expect(await issuedCount(t.db, coupon.id)).toBe(b.admitted);
  });

  it('replays of a won grab are answered with its coupon, never 429, however fast they come; new keys still get 429', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100, perUserLimit: 50, rateLimitPerSecond: 100 });
    const grab = (key: string) =>
      request(t.url)
        .post(`/coupons/${coupon.id}/grab`)
        .set(bearer(tokenFor('retrier')))
        .set('Idempotency-Key', key);
    const won = await grab('won-once');
    expect(won.status).toBe(201);
    // Twice the user's 5 per second at once: before, the limiter answered 429 to the replays past its bucket.
    const replays = await Promise.all(Array.from({ length: 10 }, () => grab('won-once')));
    expect(replays.map((r) => [r.status, r.headers['idempotent-replayed'], r.body.id])).toEqual(
      Array.from({ length: 10 }, () => [201, 'true', won.body.id]),
    );
    const fresh = await Promise.all(Array.from({ length: 10 }, (_, i) => grab(`fresh-${i}`)));
    expect(fresh.filter((r) => r.status === 429).length).toBeGreaterThan(0);
    expect(await issuedCount(t.db, coupon.id)).toBe(1 + fresh.filter((r) => r.status === 201).length);
  });

  it('duplicates sent while the first grab is in flight wait for it and replay it, never 429 from the limiter the first spent', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100, perUserLimit: 50, rateLimitPerSecond: 100 });
    const grab = () =>
      request(t.url)
        .post(`/coupons/${coupon.id}/grab`)
        .set(bearer(tokenFor('double-clicker')))
        .set('Idempotency-Key', 'in-flight-1');
    const all = await Promise.all(Array.from({ length: 10 }, grab));
    expect(all.map((r) => r.status)).toEqual(Array.from({ length: 10 }, () => 201));
    expect(new Set(all.map((r) => r.body.id)).size).toBe(1);
    expect(all.filter((r) => r.headers['idempotent-replayed'] === 'true')).toHaveLength(9);
    expect(await issuedCount(t.db, coupon.id)).toBe(1);
    // The same key for another coupon while the first is in flight: 422, as after it.
    const other = await createCoupon(t.url, { totalStock: 100, rateLimitPerSecond: 100 });
    const [first, elsewhere] = await Promise.all([
      request(t.url)
        .post(`/coupons/${coupon.id}/grab`)
        .set(bearer(tokenFor('double-clicker')))
        .set('Idempotency-Key', 'in-flight-2'),
      request(t.url)
        .post(`/coupons/${other.id}/grab`)
        .set(bearer(tokenFor('double-clicker')))
        .set('Idempotency-Key', 'in-flight-2'),
    ]);
    // Whichever of the two claimed the key first is the grab; the other is refused.
    const answers = [first, elsewhere].map((r) => `${r.status} ${r.body.code ?? ''}`).sort();
    expect(answers).toEqual(['201 ', '422 IDEMPOTENCY_KEY_REUSED']);
    // With an id that names no coupon: 404, as without a first in flight.
    const [, nowhere] = await Promise.all([
      request(t.url)
        .post(`/coupons/${coupon.id}/grab`)
        .set(bearer(tokenFor('double-clicker')))
        .set('Idempotency-Key', 'in-flight-3'),
      request(t.url)
        .post('/coupons/987654321/grab')
        .set(bearer(tokenFor('double-clicker')))
        .set('Idempotency-Key', 'in-flight-3'),
    ]);
    expect([nowhere.status, nowhere.body.code]).toEqual([404, 'COUPON_NOT_FOUND']);
  });

  it('duplicates of a grab refused as sold out get the same refusal, not 429', async () => {
    const soldOut = await createCoupon(t.url, { totalStock: 0, rateLimitPerSecond: 100 });
    const all = await Promise.all(
      Array.from({ length: 10 }, () =>
        request(t.url)
          .post(`/coupons/${soldOut.id}/grab`)
          .set(bearer(tokenFor('late-clicker')))
          .set('Idempotency-Key', 'too-late-1'),
      ),
    );
    expect(all.map((r) => [r.status, r.body.code])).toEqual(Array.from({ length: 10 }, () => [409, 'SOLD_OUT']));
  });

  it('once the instance has seen the sell-out, a shopper is told SOLD_OUT at every try, not 429, and the refusals take none of the limiter tokens', async () => {
    const gone = await createCoupon(t.url, { totalStock: 1, rateLimitPerSecond: 100 });
    const grab = (couponId: string, user: string) =>
      request(t.url)
        .post(`/coupons/${couponId}/grab`)
        .set(bearer(tokenFor(user)))
        .set('Idempotency-Key', newKey());
    expect((await grab(gone.id, 'first-clicker')).status).toBe(201);
    // The grab that finds the stock gone tells the instance.
    expect((await grab(gone.id, 'second-clicker')).body.code).toBe('SOLD_OUT');
    // Four times the user's 5 a second, at once: each refused from memory, none by the limiter.
    const retries = await Promise.all(Array.from({ length: 20 }, () => grab(gone.id, 'retry-loop')));
    expect(retries.map((r) => [r.status, r.body.code])).toEqual(Array.from({ length: 20 }, () => [409, 'SOLD_OUT']));
    // The same shopper's bucket is still full for the next coupon.
    const next = await createCoupon(t.url, { totalStock: 10, perUserLimit: 5, rateLimitPerSecond: 100 });
    const onNext = await Promise.all(Array.from({ length: 5 }, () => grab(next.id, 'retry-loop')));
    expect(onNext.map((r) => r.status)).toEqual([201, 201, 201, 201, 201]);
  });

  it('an admin change of rateLimitPerSecond applies to the next grabs without a restart', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 1000, rateLimitPerSecond: 500 });
    const patch = await request(t.url).patch(`/admin/coupons/${coupon.id}`).set(bearer(adminToken())).send({ rateLimitPerSecond: 10 });
    expect(patch.status).toBe(200);
    const b = await grabBurst([t.url], coupon.id, 60, (i) => `patched-${i}`);
    // 10 at once, plus one token per 100 ms of burst; at the old 500/s all 60 would pass.
    expect(b.admitted).toBeGreaterThanOrEqual(10);
    expect(b.admitted).toBeLessThanOrEqual(mostAdmitted(10, b.seconds));
    expect(b.limits).toEqual(['coupon']);
  });

  it('a 429 carries Retry-After and the error body with the limit that refused it', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10, rateLimitPerSecond: 1 });
    // Both at once: one after the other, the first grab's answer can take over a second on a busy
    // machine, and the bucket has its token back by the time the second asks.
    const replies = await Promise.all(
      ['first', 'second'].map((user) =>
        request(t.url)
          .post(`/coupons/${coupon.id}/grab`)
          .set(bearer(tokenFor(user)))
          .set('Idempotency-Key', newKey()),
      ),
    );
    expect(replies.map((r) => r.status).sort()).toEqual([201, 429]);
    const res = replies.find((r) => r.status === 429)!;
    expect(res.headers['retry-after']).toBe('1');
    expect(res.body).toEqual({
      code: 'RATE_LIMITED',
      message: expect.any(String),
      details: { limit: 'coupon', limitPerSecond: 1, retryAfterMs: expect.any(Number) },
    });
  });
});
