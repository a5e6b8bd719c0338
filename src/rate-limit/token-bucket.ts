import { performance } from 'node:perf_hooks';
import { RateLimiterRes } from 'rate-limiter-flexible';
import type { Limiter } from './insured-limiter.js';

/*
 * rate-limiter-flexible 11 only counts fixed windows, which can admit twice the limit in a few
 * milliseconds around a window boundary. A token bucket (capacity `points`, refilled continuously at
 * `points` per `duration` seconds) never admits more than `points` at once, so the buckets here keep
 * the library's contract instead: a consume resolves with a RateLimiterRes when admitted and rejects
 * with one (msBeforeNext = wait for the next token) when not. RateLimiterRedis runs the Lua bucket
 * below; TokenBucketMemory is the same bucket in this process.
 */

/**
 * The Redis bucket, passed to RateLimiterRedis as `customIncrTtlLuaScript`, which calls it with
 * KEYS[1] = key, ARGV = [points to take, duration s, capacity, duration s] and reads back
 * {consumed, msBeforeNext}; consumed > capacity means rejected. Redis's own clock (TIME) keeps the
 * instances of a cluster on one time line. An idle bucket is full after `duration`, which is then
 * the same as no key, so the key expires then.
 */
export const TOKEN_BUCKET_LUA = `
local want = tonumber(ARGV[1])
local capacity = tonumber(ARGV[3])
local refillMs = tonumber(ARGV[4]) * 1000
local perMs = capacity / refillMs
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = capacity
if b[1] then
  tokens = math.min(capacity, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * perMs)
end
local consumed, wait
if tokens >= want then
  tokens = tokens - want
  consumed = capacity - math.floor(tokens)
  wait = 0
else
  consumed = capacity + want
  wait = math.ceil((want - tokens) / perMs)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], refillMs)
return {consumed, wait}
`;

interface Bucket {
  tokens: number;
  at: number;
}

/**
 * Buckets of one process, shared by every TokenBucketMemory so that a limiter re-created with a new
 * capacity (an admin changed the coupon's limit) carries on with the bucket's current level.
 */
export class BucketStore {
  private readonly buckets = new Map<string, Bucket>();
  private lastSweep = performance.now();

  get(key: string): Bucket | undefined {
    return this.buckets.get(key);
  }

  /**
   * Stores a bucket. Once per `fullAfterMs` it drops the buckets idle that long: they are full, the
   * same as absent, so one key per user of a flash sale is held for at most two refill periods.
   */
  set(key: string, bucket: Bucket, fullAfterMs: number): void {
    this.buckets.set(key, bucket);
    if (bucket.at - this.lastSweep < fullAfterMs) return;
    this.lastSweep = bucket.at;
    for (const [k, b] of this.buckets) if (bucket.at - b.at >= fullAfterMs) this.buckets.delete(k);
  }

  get size(): number {
    return this.buckets.size;
  }
}

/** An in-process token bucket that answers like a rate-limiter-flexible limiter. */
export class TokenBucketMemory implements Limiter {
  readonly points: number;
  private readonly msDuration: number;
  private readonly keyPrefix: string;

  constructor(
    opts: { points: number; duration: number; keyPrefix: string },
    private readonly store: BucketStore,
    /** Called on every consume; standing in for Redis, that is every time Redis did not answer. */
    private readonly onConsume?: () => void,
  ) {
    this.points = opts.points;
    this.msDuration = opts.duration * 1000;
    this.keyPrefix = opts.keyPrefix;
  }

  consume(key: string, pointsToConsume = 1): Promise<RateLimiterRes> {
    this.onConsume?.();
    const perMs = this.points / this.msDuration;
    const rlKey = `${this.keyPrefix}:${key}`;
    const now = performance.now();
    const prev = this.store.get(rlKey);
    let tokens = prev ? Math.min(this.points, prev.tokens + Math.max(0, now - prev.at) * perMs) : this.points;
    const admitted = tokens >= pointsToConsume;
    if (admitted) tokens -= pointsToConsume;
    this.store.set(rlKey, { tokens, at: now }, this.msDuration);
    if (admitted) return Promise.resolve(new RateLimiterRes(Math.floor(tokens), 0, this.points - Math.floor(tokens), !prev));
    return Promise.reject(new RateLimiterRes(0, Math.ceil((pointsToConsume - tokens) / perMs), this.points + pointsToConsume, false));
  }
}
