import { randomBytes } from 'node:crypto';
import { Test } from '@nestjs/testing';
import { AppError } from '../src/common/errors.js';
import { registry } from '../src/common/metrics.js';
import { loadConfig } from '../src/config/app-config.js';
import { ConfigModule } from '../src/config/config.module.js';
import { RateLimitModule } from '../src/rate-limit/rate-limit.module.js';
import { RateLimitService } from '../src/rate-limit/rate-limit.service.js';

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

/** Runs `n` admissions at once; returns how many passed and the errors of the others. */
export async function admitMany(n: number, admit: (i: number) => Promise<void>): Promise<{ admitted: number; rejected: AppError[] }> {
  const results = await Promise.allSettled(Array.from({ length: n }, (_, i) => admit(i)));
  const rejected = results.flatMap((r) => (r.status === 'rejected' ? [r.reason as AppError] : []));
  return { admitted: n - rejected.length, rejected };
}

/** The rate limiter's decision counter for one coupon and result. */
export async function decisionCount(couponId: string, result: string): Promise<number> {
  const metric = registry.getSingleMetric('rate_limit_grab_decisions_total');
  const values = metric ? (await metric.get()).values : [];
  return Number(values.find((v) => v.labels.coupon_id === couponId && v.labels.result === result)?.value ?? 0);
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls until `check` holds, or fails after `timeoutMs`. */
export async function waitFor(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}
