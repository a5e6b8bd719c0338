import { Injectable, Logger, OnModuleDestroy, OnModuleInit } from '@nestjs/common';
import { Redis, ReplyError } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { AppError } from '../common/errors.js';
import { counter, gauge } from '../common/metrics.js';
import { AppConfig, ConfigError } from '../config/app-config.js';
import { InsuredLimiter, type Limiter } from './insured-limiter.js';
import { BucketStore, TOKEN_BUCKET_LUA, TokenBucketMemory } from './token-bucket.js';

/** Redis answers in well under a millisecond; one that has not answered by then is not worth waiting for. */
const REDIS_DEADLINE_MS = 250;
const REDIS_CONNECT_TIMEOUT_MS = 1000;
/** Only bounds how long ioredis keeps commands a hung Redis never answers; the decision was taken at the deadline. */
const REDIS_COMMAND_TIMEOUT_MS = 5000;
/** How long boot waits for Redis before starting on the in-memory buckets. */
const REDIS_BOOT_WAIT_MS = 2000;

const decisions = counter(
  'rate_limit_grab_decisions_total',
  'Grab requests seen by the rate limiter, per coupon: admitted, rejected_coupon, rejected_user',
  ['coupon_id', 'result'],
);
const fallbacks = counter('rate_limit_redis_fallback_total', 'Limiter decisions taken on in-memory buckets because Redis did not answer', [
  'scope',
]);
const redisReady = gauge('rate_limit_redis_ready', '1 while the rate limiter uses Redis, 0 while it runs on in-memory buckets');

type Scope = 'coupon' | 'user';

/**
 * Admission control in front of the grab: a token bucket per coupon (capacity and refill per second
 * = the coupon's rateLimitPerSecond, default RATE_LIMIT_PER_SECOND) and one per user
 * (RATE_LIMIT_PER_USER_PER_SECOND). Buckets live in this process, or in Redis when REDIS_URL is set
 * so that all instances share them; when Redis does not answer (within REDIS_DEADLINE_MS), each
 * instance decides on its own in-memory buckets (the insurance limiters) until Redis is back.
 */
@Injectable()
export class RateLimitService implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger(RateLimitService.name);
  private readonly store = new BucketStore();
  private readonly redis?: Redis;
  /** Coupon limiters by capacity: a coupon whose limit an admin changed simply uses another one, on the same bucket. */
  private readonly couponLimiters = new Map<number, Limiter>();
  private readonly userLimiter: Limiter;
  /** Keys are namespaced by database: instances sharing a database share buckets, other deployments on the same Redis do not. */
  private readonly keyPrefix: string;
  private closing = false;
  /** What Redis answered to the connection's own set-up (SELECT of REDIS_URL's database, AUTH), when it refused it. */
  private refusal?: string;

  constructor(private readonly config: AppConfig) {
    this.keyPrefix = `ce:${config.DB_NAME}:grab`;
    if (config.RATE_LIMIT_ENABLED && config.REDIS_URL) this.redis = this.connect(config.REDIS_URL);
    this.userLimiter = this.limiter('user', config.RATE_LIMIT_PER_USER_PER_SECOND);
  }

  async onModuleInit(): Promise<void> {
    const redis = this.redis;
    if (!redis) return;
    const ready =
      redis.status === 'ready' ||
      (await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), REDIS_BOOT_WAIT_MS);
        redis.once('ready', () => {
          clearTimeout(timer);
          resolve(true);
        });
      }));
    // A refused set-up leaves the connection usable, on another database than REDIS_URL names: a setting to fix, not to run with.
    if (this.refusal) {
      redis.disconnect();
      throw new ConfigError(`REDIS_URL: Redis refused the connection's set-up: ${this.refusal}`);
    }
    if (!ready) this.logger.warn(`Redis not reachable within ${REDIS_BOOT_WAIT_MS} ms; rate limits are per instance until it is`);
  }

  onModuleDestroy(): void {
    this.closing = true;
    this.redis?.disconnect();
  }

  /** Where the buckets are right now. */
  backend(): 'redis' | 'memory' {
    return this.redis?.status === 'ready' ? 'redis' : 'memory';
  }

  /**
   * Call before any database work of a grab. Throws 429 RATE_LIMITED with Retry-After when the user
   * or the coupon is over its limit. The user is checked first, so a user's excess requests never
   * take tokens from the coupon that other users are waiting for.
   */
  async admitGrab(couponId: string, userId: string, couponRateLimitPerSecond: number | null): Promise<void> {
    if (!this.config.RATE_LIMIT_ENABLED) return;
    const perCoupon = Math.max(1, Math.floor(couponRateLimitPerSecond ?? this.config.RATE_LIMIT_PER_SECOND));
    await this.take('user', this.userLimiter, userId, couponId);
    await this.take('coupon', this.couponLimiter(perCoupon), couponId, couponId);
    decisions.inc({ coupon_id: couponId, result: 'admitted' });
  }

  private async take(scope: Scope, limiter: Limiter, key: string, couponId: string): Promise<void> {
    try {
      await limiter.consume(key);
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) throw err;
      decisions.inc({ coupon_id: couponId, result: `rejected_${scope}` });
      const retryAfter = Math.max(1, Math.ceil(err.msBeforeNext / 1000));
      const what =
        scope === 'user' ? 'You are sending grab requests too fast' : 'This coupon is receiving more grab requests than it admits';
      throw new AppError(
        'RATE_LIMITED',
        `${what}; retry in ${retryAfter} s`,
        { limit: scope, limitPerSecond: limiter.points, retryAfterMs: err.msBeforeNext },
        { 'Retry-After': String(retryAfter) },
      );
    }
  }

  private couponLimiter(points: number): Limiter {
    let limiter = this.couponLimiters.get(points);
    if (!limiter) {
      limiter = this.limiter('coupon', points);
      this.couponLimiters.set(points, limiter);
    }
    return limiter;
  }

  private limiter(scope: Scope, points: number): Limiter {
    const opts = { points, duration: 1, keyPrefix: `${this.keyPrefix}:${scope}` };
    if (!this.redis) return new TokenBucketMemory(opts, this.store);
    const shared = new RateLimiterRedis({
      ...opts,
      storeClient: this.redis,
      customIncrTtlLuaScript: TOKEN_BUCKET_LUA,
      // Without a connection, fail at once so the local bucket decides without waiting for the deadline.
      rejectIfRedisNotReady: true,
    });
    return new InsuredLimiter(shared, new TokenBucketMemory(opts, this.store, () => fallbacks.inc({ scope })), REDIS_DEADLINE_MS);
  }

  private connect(url: string): Redis {
    const redis = new Redis(url, {
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      connectTimeout: REDIS_CONNECT_TIMEOUT_MS,
      commandTimeout: REDIS_COMMAND_TIMEOUT_MS,
      // Keep trying, at most a second apart, so an instance is back on Redis soon after Redis is.
      retryStrategy: (times) => Math.min(times * 100, 1000),
    });
    let up = false;
    redis.on('ready', () => {
      up = true;
      redisReady.set(1);
      if (!this.refusal) this.logger.log('Rate limiter buckets are in Redis (cluster-wide limits)');
    });
    redis.on('close', () => {
      redisReady.set(0);
      if (up && !this.closing) this.logger.warn('Redis connection lost; rate limits fall back to per-instance in-memory buckets');
      up = false;
    });
    // Outages are reported once, by 'close'; ioredis would otherwise print every failed reconnect.
    redis.on('error', (err: Error) => {
      if (!(err instanceof ReplyError) || this.refusal === err.message) return;
      this.refusal = err.message;
      this.logger.error(`Redis refused the connection's set-up (check REDIS_URL): ${err.message}`);
    });
    return redis;
  }
}
