import { randomBytes } from 'node:crypto';
import { Agent } from 'node:http';
import { performance } from 'node:perf_hooks';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import { AppError } from '../src/common/errors.js';
import { registry } from '../src/common/metrics.js';
import { loadConfig } from '../src/config/app-config.js';
import { ConfigModule } from '../src/config/config.module.js';
import { RateLimitModule } from '../src/rate-limit/rate-limit.module.js';
import { RateLimitService } from '../src/rate-limit/rate-limit.service.js';
import { newKey } from './support/factories.js';
import { bearer, tokenFor } from './support/harness.js';

export interface LimiterUnderTest {
  svc: RateLimitService;
  close(): Promise<void>;
}

/**
 * RateLimitService alone, wired by Nest as in the app. The Redis keys are namespaced by DB_NAME, so
 * `namespace` is what several instances pass to share buckets; a fresh one keeps runs apart.
 */
export async function startLimiter(env: Record<string, string> = {}, namespace = newNamespace()): Promise<LimiterUnderTest> {
  const config = loadConfig({ RATE_LIMIT_ENABLED: 'true', DB_NAME: namespace, ...env });
  const moduleRef = await Test.createTestingModule({ imports: [ConfigModule.forRoot(config), RateLimitModule] }).compile();
  await moduleRef.init();
  return { svc: moduleRef.get(RateLimitService), close: () => moduleRef.close() };
}

export const newNamespace = () => `rl_${process.pid}_${randomBytes(4).toString('hex')}`;

/** Runs `n` admissions at once; returns how many passed, the errors of the others and how long it took. */
export async function admitMany(
  n: number,
  admit: (i: number) => Promise<void>,
): Promise<{ admitted: number; rejected: AppError[]; seconds: number }> {
  const started = performance.now();
  const results = await Promise.allSettled(Array.from({ length: n }, (_, i) => admit(i)));
  const rejected = results.flatMap((r) => (r.status === 'rejected' ? [r.reason as AppError] : []));
  return { admitted: n - rejected.length, rejected, seconds: (performance.now() - started) / 1000 };
}

/**
 * The most a bucket of `capacity` refilled at `capacity` per second can admit in `seconds`: all it
 * holds plus the refill. +1 for rounding. On a busy machine a burst takes longer and gets more refill.
 */
export const mostAdmitted = (capacity: number, seconds: number) => capacity + Math.ceil(capacity * seconds) + 1;

/** The sum of a metric's values whose labels include `labels`. */
export async function metricSum(name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = registry.getSingleMetric(name);
  const values = metric ? (await metric.get()).values : [];
  return values
    .filter((v) => Object.entries(labels).every(([k, want]) => v.labels[k] === want))
    .reduce((sum, v) => sum + Number(v.value), 0);
}

/** The rate limiter's decision counter for one coupon and result. */
export const decisionCount = (couponId: string, result: string) =>
  metricSum('rate_limit_grab_decisions_total', { coupon_id: couponId, result });

/** Decisions taken on in-memory buckets because Redis did not answer, in this process. */
export const fallbackCount = () => metricSum('rate_limit_redis_fallback_total');

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls until `check` holds, or fails after `timeoutMs`. */
export async function waitFor(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

export interface BurstResult {
  /** performance.now() when the first request was sent, after the connections were opened. */
  startedAt: number;
  /** From the first request sent to the last answer received. */
  seconds: number;
  admitted: number;
  rateLimited: number;
  /** Which limits (user, coupon) the 429s named. */
  limits: string[];
  /** 429s whose Retry-After is not an integer >= 1. */
  badRetryAfter: number;
  /** Answers other than 201 and 429, as "status code". */
  other: string[];
}

/**
 * An agent holding `sockets` open connections to each instance. A burst has to be on the wire at once
 * to test a limiter: opening 2,000 connections at once overflows the listen backlog (511) and the
 * dropped handshakes come back one and three seconds later, while a small pool turns the client into
 * a closed loop paced by the database (every admitted grab holds its connection until it commits).
 * So the pool grows by at most WARM_STEP new connections at a time.
 */
const WARM_STEP = 400;
async function warmAgent(urls: string[], sockets: number): Promise<Agent> {
  const agent = new Agent({ keepAlive: true, maxSockets: sockets, maxFreeSockets: sockets });
  for (let open = 0; open < sockets;) {
    open = Math.min(sockets, open + WARM_STEP);
    await Promise.all(urls.flatMap((url) => Array.from({ length: open }, () => request(url).get('/rate-limit-warm-up').agent(agent))));
  }
  return agent;
}

/**
 * One grab per instance, then a refill period, so the burst meets a full bucket and a warm template
 * cache: on a cold cache every grab of the burst reads the coupon from the database before it reaches
 * the limiter (the read is not shared between concurrent grabs), which paces the burst by the
 * database and, on a loaded machine, gives a few 503s. Returns the user coupons it issued.
 */
export async function warmCoupon(urls: string[], couponId: string): Promise<number> {
  for (const url of urls) {
    const res = await request(url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor(`warm-up-${randomBytes(4).toString('hex')}`)))
      .set('Idempotency-Key', newKey('warm'));
    if (res.status !== 201) throw new Error(`warm-up grab: ${res.status} ${JSON.stringify(res.body)}`);
  }
  await sleep(1000);
  return urls.length;
}

/** Fires `n` grabs at once, spread round-robin over the instances at `urls`, each with its own Idempotency-Key. */
export async function grabBurst(urls: string[], couponId: string, n: number, userOf: (i: number) => string): Promise<BurstResult> {
  const agent = await warmAgent(urls, Math.min(Math.ceil(n / urls.length), 500));
  const started = performance.now();
  const answers = await Promise.all(
    Array.from({ length: n }, (_, i) =>
      request(urls[i % urls.length])
        .post(`/coupons/${couponId}/grab`)
        .agent(agent)
        .set(bearer(tokenFor(userOf(i))))
        .set('Idempotency-Key', newKey('rl')),
    ),
  );
  const seconds = (performance.now() - started) / 1000;
  agent.destroy();
  const limited = answers.filter((r) => r.status === 429);
  return {
    startedAt: started,
    seconds,
    admitted: answers.filter((r) => r.status === 201).length,
    rateLimited: limited.length,
    limits: [...new Set(limited.map((r) => String(r.body.details?.limit)))].sort(),
    badRetryAfter: limited.filter((r) => r.body.code !== 'RATE_LIMITED' || !/^[1-9][0-9]*$/.test(String(r.headers['retry-after']))).length,
    other: answers.filter((r) => r.status !== 201 && r.status !== 429).map((r) => `${r.status} ${r.body.code}`),
  };
}

export async function issuedCount(db: DataSource, couponId: string): Promise<number> {
  const [{ n }] = (await db.query('SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?', [couponId])) as { n: string }[];
  return Number(n);
}

/**
 * Records the decisions of the real service (when, by performance.now(), and whether admitted) by
 * wrapping admitGrab on the app's own instance; the limiter itself runs unchanged.
 */
export function recordDecisions(svc: RateLimitService): { decisions: { at: number; admitted: boolean }[]; stop(): void } {
  const decisions: { at: number; admitted: boolean }[] = [];
  const real = svc.admitGrab;
  svc.admitGrab = async function (this: RateLimitService, ...args) {
    try {
      await real.apply(this, args);
      decisions.push({ at: performance.now(), admitted: true });
    } catch (err) {
      decisions.push({ at: performance.now(), admitted: false });
      throw err;
    }
  };
  return { decisions, stop: () => void (svc.admitGrab = real) };
}
