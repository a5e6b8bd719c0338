import { performance } from 'node:perf_hooks';
import { AppError } from '../src/common/errors.js';
import { BucketStore, TokenBucketMemory } from '../src/rate-limit/token-bucket.js';
import { admitMany, decisionCount, LimiterUnderTest, mostAdmitted, sleep, startLimiter } from './rate-limit.helpers.js';

describe('RateLimitService, in-memory buckets', () => {
  let l: LimiterUnderTest;
  beforeAll(async () => {
    l = await startLimiter({ RATE_LIMIT_PER_SECOND: '40', RATE_LIMIT_PER_USER_PER_SECOND: '5' });
  });
  afterAll(() => l.close());

  it('admits a full bucket at once, then answers 429 RATE_LIMITED with an integer Retry-After >= 1', async () => {
    const { admitted, rejected, seconds } = await admitMany(100, (i) => l.svc.admitGrab('c-burst', `u-${i}`, 50));
    expect(admitted).toBeGreaterThanOrEqual(50);
    expect(admitted).toBeLessThanOrEqual(mostAdmitted(50, seconds));
    expect(rejected).toHaveLength(100 - admitted);
    for (const e of rejected) {
      expect(e).toBeInstanceOf(AppError);
      expect(e.code).toBe('RATE_LIMITED');
      expect(e.status).toBe(429);
      expect(e.details).toMatchObject({ limit: 'coupon', limitPerSecond: 50 });
      expect(e.headers?.['Retry-After']).toMatch(/^[1-9][0-9]*$/);
    }
  });

  it('refills continuously at the limit per second, not in whole windows', async () => {
    await admitMany(60, (i) => l.svc.admitGrab('c-refill', `u-${i}`, 50));
    const emptied = performance.now();
    // 250 ms, not 200: a timer can fire a millisecond early, and 199 ms refill only 9 tokens.
    await sleep(250);
    const { admitted } = await admitMany(50, (i) => l.svc.admitGrab('c-refill', `v-${i}`, 50));
    const seconds = (performance.now() - emptied) / 1000;
    // 50/s over >= 200 ms is >= 10 tokens; timers may run late on a busy machine, so the upper bound
    // is what refilled over the time that really passed (+1 for rounding), at most the bucket.
    expect(admitted).toBeGreaterThanOrEqual(10);
    expect(admitted).toBeLessThanOrEqual(Math.min(50, Math.ceil(50 * seconds) + 1));
  });

  it('uses RATE_LIMIT_PER_SECOND when the coupon has no limit of its own', async () => {
    const { admitted, seconds } = await admitMany(100, (i) => l.svc.admitGrab('c-default', `u-${i}`, null));
    expect(admitted).toBeGreaterThanOrEqual(40);
    expect(admitted).toBeLessThanOrEqual(mostAdmitted(40, seconds));
  });

  it('applies a changed coupon limit on the next call, on the same bucket', async () => {
    expect((await admitMany(20, (i) => l.svc.admitGrab('c-change', `u-${i}`, 100))).admitted).toBe(20);
    // Lowered to 5: the 80 tokens left are clipped to the new capacity at once.
    const lowered = await admitMany(20, (i) => l.svc.admitGrab('c-change', `v-${i}`, 5));
    expect(lowered.admitted).toBeGreaterThanOrEqual(5);
    expect(lowered.admitted).toBeLessThanOrEqual(mostAdmitted(5, lowered.seconds));
    await sleep(1050);
    // Raised to 30: after a second the bucket has refilled to the new capacity.
    const raised = await admitMany(40, (i) => l.svc.admitGrab('c-change', `w-${i}`, 30));
    expect(raised.admitted).toBeGreaterThanOrEqual(30);
    expect(raised.admitted).toBeLessThanOrEqual(mostAdmitted(30, raised.seconds));
  });

  it('stops one user at RATE_LIMIT_PER_USER_PER_SECOND without taking the coupon tokens other users need', async () => {
    const script = await admitMany(20, () => l.svc.admitGrab('c-user', 'scripter', 10));
    expect(script.admitted).toBeGreaterThanOrEqual(5);
    expect(script.admitted).toBeLessThanOrEqual(mostAdmitted(5, script.seconds));
    expect(script.rejected.every((e) => e.code === 'RATE_LIMITED' && e.details?.limit === 'user')).toBe(true);
    // The script's refused requests took nothing from the coupon: 10 - script.admitted tokens are left.
    const others = await admitMany(10, (i) => l.svc.admitGrab('c-user', `fair-${i}`, 10));
    expect(others.admitted).toBeGreaterThanOrEqual(10 - script.admitted);
    expect(others.admitted).toBeLessThanOrEqual(mostAdmitted(10, script.seconds + others.seconds) - script.admitted);
    expect(others.rejected.every((e) => e.details?.limit === 'coupon')).toBe(true);
  });

  it('counts admitted and rejected requests per coupon', async () => {
    // One user, 8 requests: some pass the user guard (5) but not the coupon (3).
    const r = await admitMany(8, () => l.svc.admitGrab('c-metrics', 'm-1', 3));
    const refusedBy = (limit: string) => r.rejected.filter((e) => e.details?.limit === limit).length;
    expect(refusedBy('coupon')).toBeGreaterThan(0);
    expect(refusedBy('user')).toBeGreaterThan(0);
    expect(await decisionCount('c-metrics', 'admitted')).toBe(r.admitted);
    expect(await decisionCount('c-metrics', 'rejected_user')).toBe(refusedBy('user'));
    expect(await decisionCount('c-metrics', 'rejected_coupon')).toBe(refusedBy('coupon'));
  });

  it('admits everything when RATE_LIMIT_ENABLED is false', async () => {
    const off = await startLimiter({ RATE_LIMIT_ENABLED: 'false' });
    try {
      expect((await admitMany(500, () => off.svc.admitGrab('c-off', 'one-user', 1))).admitted).toBe(500);
    } finally {
      await off.close();
    }
  });
});

describe('TokenBucketMemory', () => {
  it('forgets buckets idle for a refill period, which are full anyway, so per-user keys do not pile up', async () => {
    const store = new BucketStore();
    const bucket = new TokenBucketMemory({ points: 2, duration: 0.05, keyPrefix: 'sweep' }, store);
    for (let i = 0; i < 100; i++) await bucket.consume(`user-${i}`);
    expect(store.size).toBe(100);
    await sleep(60);
    await bucket.consume('late-user');
    expect(store.size).toBe(1);
    // A forgotten bucket starts full again: 2 admitted, the 3rd refused with the wait for one token.
    await bucket.consume('user-1');
    await bucket.consume('user-1');
    await expect(bucket.consume('user-1')).rejects.toMatchObject({ msBeforeNext: expect.any(Number), remainingPoints: 0 });
  });
});
