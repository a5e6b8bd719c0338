import { ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { Test } from '@nestjs/testing';
import { loadConfig } from '../src/config/app-config.js';
import { ConfigModule } from '../src/config/config.module.js';
import { RateLimitModule } from '../src/rate-limit/rate-limit.module.js';
import { RateLimitService } from '../src/rate-limit/rate-limit.service.js';
import { createCoupon } from './support/factories.js';
import { checkInvariantsAfterEach } from './support/scoped-invariants.js';
import { startTestApp, TestApp } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { freePort } from './support/net.js';
import {
  admitMany,
  fallbackCount,
  grabBurst,
  issuedCount,
  LimiterUnderTest,
  mostAdmitted,
  newNamespace,
  recordDecisions,
  startLimiter,
  waitFor,
  warmCoupon,
} from './rate-limit.helpers.js';

const SHARED_REDIS = 'redis://127.0.0.1:6379';

/** A throw-away redis-server of this test's own, so that stopping it disturbs nobody else. */
async function startRedis(port: number): Promise<ChildProcess> {
  const child = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no'],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  await waitFor('redis-server to start', () => out.includes('Ready to accept connections'));
  return child;
}

async function stopRedis(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGKILL');
  await once(child, 'exit');
}

it('loadConfig reads REDIS_URL from the environment, which cluster-wide limits depend on', () => {
  expect(loadConfig({ REDIS_URL: SHARED_REDIS }).REDIS_URL).toBe(SHARED_REDIS);
});

it.each([
  ['while the connection is being set up', 0],
  // In the whole app the other modules' set-up gives the connection time to be ready before this module's init.
  ['after the connection is ready', 500],
])('refuses to start on a database of REDIS_URL that Redis does not have (init %s), rather than use database 0 unsaid', async (_, wait) => {
  const moduleRef = await Test.createTestingModule({
    imports: [ConfigModule.forRoot(loadConfig({ RATE_LIMIT_ENABLED: 'true', REDIS_URL: `${SHARED_REDIS}/999` })), RateLimitModule],
  }).compile();
  await new Promise((r) => setTimeout(r, wait));
  try {
    await expect(moduleRef.init()).rejects.toThrow(/^REDIS_URL: Redis refused the connection's set-up: ERR DB index is out of range/);
  } finally {
    await moduleRef.close();
  }
});

describe('rate limits in Redis (127.0.0.1:6379): instances share one bucket', () => {
  const namespace = newNamespace();
  let a: LimiterUnderTest;
  let b: LimiterUnderTest;
  let probe: Redis;
  beforeAll(async () => {
    const env = { REDIS_URL: SHARED_REDIS, RATE_LIMIT_PER_USER_PER_SECOND: '5' };
    a = await startLimiter(env, namespace);
    b = await startLimiter(env, namespace);
    probe = new Redis(SHARED_REDIS);
  });
  afterAll(async () => {
    await a.close();
    await b.close();
    probe.disconnect();
  });

  it('two instances together admit one coupon limit, and the bucket is a Redis key that expires', async () => {
    expect([a.svc.backend(), b.svc.backend()]).toEqual(['redis', 'redis']);
    const fallbacksBefore = await fallbackCount();
    const onA = await admitMany(30, (i) => a.svc.admitGrab('c-shared', `a-${i}`, 50));
    const onB = await admitMany(40, (i) => b.svc.admitGrab('c-shared', `b-${i}`, 50));
    expect(onA.admitted).toBe(30);
    // 20 tokens were left for B, plus what refilled at 50/s meanwhile; separate buckets would admit all 40.
    expect(onB.admitted).toBeGreaterThanOrEqual(20);
    expect(onB.admitted).toBeLessThanOrEqual(mostAdmitted(50, onA.seconds + onB.seconds) - 30);
    expect(onB.rejected.every((e) => e.code === 'RATE_LIMITED' && e.details?.limit === 'coupon')).toBe(true);
    expect(await fallbackCount()).toBe(fallbacksBefore);
    const key = `ce:${namespace}:grab:coupon:c-shared`;
    expect(Number(await probe.hget(key, 'tokens'))).toBeLessThan(50);
    expect(await probe.pttl(key)).toBeGreaterThan(0);
    expect(await probe.pttl(key)).toBeLessThanOrEqual(1000);
  });

  it('the per-user guard is cluster-wide too', async () => {
    const onA = await admitMany(3, () => a.svc.admitGrab('c-user', 'roaming-script', 100));
    const onB = await admitMany(5, () => b.svc.admitGrab('c-user', 'roaming-script', 100));
    expect(onA.admitted).toBe(3);
    expect(onB.admitted).toBeGreaterThanOrEqual(2);
    expect(onB.admitted).toBeLessThanOrEqual(mostAdmitted(5, onA.seconds + onB.seconds) - 3);
    expect(onB.rejected.every((e) => e.details?.limit === 'user')).toBe(true);
  });

  it('a reply that came while the event loop was busy past the deadline still decides, not the local bucket', async () => {
    const fallbacksBefore = await fallbackCount();
    const pending = a.svc.admitGrab('c-stall', 'stalled-user', 10);
    // The command is on the wire; block the loop for well over the 250 ms deadline, as a burst can.
    const until = performance.now() + 600;
    while (performance.now() < until);
    await pending;
    expect(await fallbackCount()).toBe(fallbacksBefore);
  });
});

describe('grab route on two app instances sharing the database and Redis', () => {
  let t1: TestApp;
  let t2: TestApp;
  beforeAll(async () => {
    // A long template cache, as in rate-limit-http.spec.ts: the burst should meet the limiter, not template reloads.
    t1 = await startTestApp({ RATE_LIMIT_ENABLED: 'true', REDIS_URL: SHARED_REDIS, COUPON_CACHE_TTL_MS: '60000' });
    t2 = await startTestApp({}, t1.config);
  });
  afterAll(async () => {
    await t2?.close();
    await t1?.close();
  });

  // Small on purpose: the decisions should span well under a second, so that the shared bound
  // (LIMIT + LIMIT/s x span) stays below the 2 x LIMIT that a bucket per instance would admit.
  const LIMIT = 50;
  const BURST = 4 * LIMIT;

  it(`a burst of ${BURST} grabs split over both instances is admitted at one limit of ${LIMIT}/s, not ${LIMIT}/s each`, async () => {
    expect([t1.app.get(RateLimitService).backend(), t2.app.get(RateLimitService).backend()]).toEqual(['redis', 'redis']);
    const coupon = await createCoupon(t1.url, { totalStock: 5000, rateLimitPerSecond: LIMIT });
    const warmUps = await warmCoupon([t1.url, t2.url], coupon.id);
    const fallbacksBefore = await fallbackCount();
    const rec1 = recordDecisions(t1.app.get(RateLimitService));
    const rec2 = recordDecisions(t2.app.get(RateLimitService));
    const b = await grabBurst([t1.url, t2.url], coupon.id, BURST, (i) => `pair-${i}`);
    rec1.stop();
    rec2.stop();
    expect(b.other).toEqual([]);
    expect(b.admitted + b.rateLimited).toBe(BURST);
    // Every decision came from Redis: a command that timed out would have used a local bucket.
    expect(await fallbackCount()).toBe(fallbacksBefore);
    expect(b.badRetryAfter).toBe(0);
    expect(await issuedCount(t1.db, coupon.id)).toBe(b.admitted + warmUps);
    expect(await checkInvariants(t1.db)).toEqual([]);
    // Redis took every decision between the first request sent and the last decision recorded (a
    // reply is read after Redis decided), so the shared bucket admitted at most LIMIT + LIMIT/s over
    // that span. With a bucket per instance, each instance would admit its own LIMIT: 2 x LIMIT at once.
    expect(b.admitted).toBeGreaterThanOrEqual(LIMIT);
    const lastDecision = Math.max(...[...rec1.decisions, ...rec2.decisions].map((d) => d.at));
    const span = (lastDecision - b.startedAt) / 1000;
    expect(b.admitted).toBeLessThanOrEqual(mostAdmitted(LIMIT, span));
    const perInstance = [rec1, rec2].map((r) => r.decisions.filter((d) => d.admitted).length);
    console.log(
      `two instances, ${BURST} grabs at ${LIMIT}/s: ${b.admitted} admitted (${perInstance.join(' + ')}) by decisions over ${span.toFixed(2)} s ` +
        `(bound ${mostAdmitted(LIMIT, span)}; a bucket per instance would admit >= ${2 * LIMIT}); answers in ${b.seconds.toFixed(1)} s`,
    );
  });
});

describe('Redis stopped mid-test', () => {
  let t: TestApp;
  let redis: ChildProcess;
  let port: number;
  let probe: Redis;
  const svc = () => t.app.get(RateLimitService);

  beforeAll(async () => {
    port = await freePort();
    redis = await startRedis(port);
    t = await startTestApp({ RATE_LIMIT_ENABLED: 'true', REDIS_URL: `redis://127.0.0.1:${port}` });
    probe = new Redis(port, '127.0.0.1', { lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null });
  });
  afterAll(async () => {
    probe?.disconnect();
    await t?.close();
    if (redis) await stopRedis(redis);
  });
  checkInvariantsAfterEach(() => t.db);

  it('a hung Redis (SIGSTOP) costs a grab about the 250 ms deadline, then the local buckets decide', async () => {
    const fallbacksBefore = await fallbackCount();
    redis.kill('SIGSTOP');
    try {
      const started = performance.now();
      await svc().admitGrab('c-hung', 'patient-user', 10);
      const ms = performance.now() - started;
      // Two decisions (user, then coupon), each waiting for the deadline; a timer can fire a few ms early.
      expect(ms).toBeGreaterThanOrEqual(2 * 250 - 5);
      expect(ms).toBeLessThan(2 * 250 + 1000);
      expect((await fallbackCount()) - fallbacksBefore).toBe(2);
    } finally {
      redis.kill('SIGCONT');
    }
    await svc().admitGrab('c-hung', 'patient-user-2', 10);
    expect((await fallbackCount()) - fallbacksBefore).toBe(2);
  });

  it('keeps answering on in-memory buckets while Redis is down and goes back to Redis when it returns', async () => {
    expect(svc().backend()).toBe('redis');
    const coupon = await createCoupon(t.url, { totalStock: 5000, rateLimitPerSecond: 50 });
    const warmUps = await warmCoupon([t.url], coupon.id);
    const bucketKey = `ce:${t.config.DB_NAME}:grab:coupon:${coupon.id}`;

    // Redis is killed while a burst is in flight: every grab still gets 201 or 429, none a 5xx.
    const inFlight = grabBurst([t.url], coupon.id, 300, (i) => `outage-${i}`);
    setTimeout(() => void stopRedis(redis), 20);
    const during = await inFlight;
    expect(during.other).toEqual([]);
    expect(during.admitted + during.rateLimited).toBe(300);
    await waitFor('the limiter to notice Redis is gone', () => svc().backend() === 'memory');
    const fallbacksBeforeDown = await fallbackCount();

    // With Redis down, this instance's own bucket still holds the coupon to 50/s.
    await new Promise((r) => setTimeout(r, 1000));
    const down = await grabBurst([t.url], coupon.id, 120, (i) => `down-${i}`);
    expect(down.other).toEqual([]);
    expect(down.admitted).toBeGreaterThanOrEqual(50);
    expect(down.admitted).toBeLessThanOrEqual(50 + Math.ceil(50 * down.seconds) + 2);
    expect(down.badRetryAfter).toBe(0);
    // Two decisions (user, coupon) per admitted grab, one or two per refused one, all in memory.
    expect((await fallbackCount()) - fallbacksBeforeDown).toBeGreaterThanOrEqual(120);

    redis = await startRedis(port);
    await waitFor('the limiter to reconnect to Redis', () => svc().backend() === 'redis', 5000);
    const fallbacksBeforeBack = await fallbackCount();
    const back = await grabBurst([t.url], coupon.id, 20, (i) => `back-${i}`);
    expect(back.other).toEqual([]);
    expect(await fallbackCount()).toBe(fallbacksBeforeBack);
    await probe.connect();
    expect(await probe.exists(bucketKey)).toBe(1);
    expect(await issuedCount(t.db, coupon.id)).toBe(warmUps + during.admitted + down.admitted + back.admitted);
    console.log(
      `redis outage: during the kill ${during.admitted}/300 admitted; on memory ${down.admitted}/120 admitted in ${down.seconds.toFixed(1)} s; ` +
        `after restart ${back.admitted}/20 admitted and the bucket is back in Redis`,
    );
  });
});
