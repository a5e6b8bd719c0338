import { RateLimiterRes } from 'rate-limiter-flexible';

/** What the rate-limit service needs of a limiter; rate-limiter-flexible's limiters and TokenBucketMemory are all one. */
export interface Limiter {
  readonly points: number;
  consume(key: string): Promise<RateLimiterRes>;
}

/**
 * A shared (Redis) limiter backed by a local one that decides whenever the shared one fails or has
 * not answered within `deadlineMs`.
 *
 * rate-limiter-flexible's own `insuranceLimiter` only steps in when the Redis client gives up, and
 * ioredis's command timeout runs in the timers phase of the event loop, before the poll phase reads
 * replies: after the loop was busy for longer than the timeout (a burst of requests does that),
 * commands that Redis answered in time count as timed out, and the decisions go to per-instance
 * buckets. The deadline here is checked with setImmediate, after the poll phase, so a reply that
 * is already waiting is read first and still decides.
 */
export class InsuredLimiter implements Limiter {
  constructor(
    private readonly shared: Limiter,
    private readonly insurance: Limiter,
    private readonly deadlineMs: number,
  ) {}

  get points(): number {
    return this.shared.points;
  }

  consume(key: string): Promise<RateLimiterRes> {
    return new Promise((resolve, reject) => {
      let decided = false;
      const decide = (decision: () => void) => {
        if (decided) return;
        decided = true;
        clearTimeout(timer);
        decision();
      };
      const fallBack = () => decide(() => this.insurance.consume(key).then(resolve, reject));
      const timer = setTimeout(() => setImmediate(fallBack), this.deadlineMs);
      this.shared.consume(key).then(
        (res) => decide(() => resolve(res)),
        (err: unknown) => (err instanceof RateLimiterRes ? decide(() => reject(err)) : fallBack()),
      );
    });
  }
}
