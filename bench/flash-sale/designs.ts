/** The server a design runs in: production's own entry, or the shipped app plus the reference routes. */
const SHIPPED_ENTRY = 'dist/src/main.js';
const REFERENCE_ENTRY = 'dist/bench/reference-server.js';

export interface Design {
  id: string;
  title: string;
  entry: string;
  route(couponId: string): string;
  /** GET for the public read routes (sent without a token, as an anonymous shopper's browser does); POST otherwise. */
  method?: 'GET' | 'POST';
  /** Added to the server's environment: how a strategy switch of the shipped service is selected. */
  env: Record<string, string>;
  /** Grab designs are checked against the database; the no-op route and the public reads only for their answers. */
  kind: 'grab' | 'noop' | 'read';
  /** False only for the design that is here to show overselling: its violations are reported, not fatal. */
  mustHold: boolean;
}

export const READ_THEN_WRITE: Design = {
  id: 'read-then-write',
  title: 'read stock, check, write (no transaction)',
  entry: REFERENCE_ENTRY,
  route: (id) => `/ref/read-then-write/coupons/${id}/grab`,
  env: {},
  kind: 'grab',
  mustHold: false,
};

export const TX_CONDITIONAL: Design = {
  id: 'tx-conditional',
  title: 'one transaction, conditional UPDATE',
  entry: REFERENCE_ENTRY,
  route: (id) => `/ref/tx-conditional/coupons/${id}/grab`,
  env: {},
  kind: 'grab',
  mustHold: true,
};

export const NOOP: Design = {
  id: 'noop',
  title: 'no-op route, same stack (ceiling)',
  entry: REFERENCE_ENTRY,
  route: () => '/noop',
  env: {},
  kind: 'noop',
  mustHold: true,
};

/** The no-op answered as the shipped grab is, ahead of Fastify: what the grab costs beyond HTTP and the token. */
export const NOOP_AHEAD: Design = {
  ...NOOP,
  id: 'noop:ahead',
  title: 'no-op route answered ahead of Fastify, as the grab is',
  route: () => '/noop-ahead',
};

/** How many live coupons the public list shows in its run: one page of the default size. */
export const LIST_COUPONS = 20;

/** The public coupon page every shopper reloads during the sale (issue 22), on the shipped server. */
export const COUPON_PAGE: Design = {
  id: 'page',
  title: 'GET /coupons/:id, the public coupon page',
  entry: SHIPPED_ENTRY,
  route: (id) => `/coupons/${id}`,
  method: 'GET',
  env: {},
  kind: 'read',
  mustHold: true,
};

export const COUPON_LIST: Design = {
  id: 'list',
  title: `GET /coupons, the public coupon list (${LIST_COUPONS} live coupons)`,
  entry: SHIPPED_ENTRY,
  route: () => `/coupons?limit=${LIST_COUPONS}`,
  method: 'GET',
  env: {},
  kind: 'read',
  mustHold: true,
};

/**
 * The service as shipped, once per GRAB_STRATEGY value given (none given: once, with the
 * service's default). Adding a strategy to compare is adding a value to the list; a value may carry
 * more settings after `+` (`grouped+GRAB_GROUP_MAX=100`), so tunings are compared in one run too.
 */
export function shippedDesigns(strategies: readonly string[]): Design[] {
  const base = { entry: SHIPPED_ENTRY, route: (id: string) => `/coupons/${id}/grab`, kind: 'grab' as const, mustHold: true };
  if (strategies.length === 0) return [{ ...base, id: 'shipped', title: 'the service as shipped', env: {} }];
  return strategies.map((s) => {
    const [strategy, ...settings] = s.split('+');
    if (!settings.every((kv) => kv.indexOf('=') > 0)) throw new Error(`--strategies: "${s}": settings after + are NAME=value`);
    const env = Object.fromEntries([
      ['GRAB_STRATEGY', strategy],
      ...settings.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
    ]);
    const title = Object.entries(env)
      .map(([k, v]) => `${k}=${v}`)
      .join(' ');
    return { ...base, id: `shipped:${s}`, title: `the service as shipped, ${title}`, env };
  });
}

export interface Scenario {
  id: 'throughput' | 'limiter';
  title: string;
  /** Added to every server's environment in this scenario. */
  env: Record<string, string>;
  /** The limiter's rate per coupon (also the coupon's own rateLimitPerSecond); absent when the limiter is off. */
  limiterRate?: number;
}

export const THROUGHPUT: Scenario = { id: 'throughput', title: 'rate limiter off', env: { RATE_LIMIT_ENABLED: 'false' } };

export function limiterScenario(rate: number): Scenario {
  return {
    id: 'limiter',
    title: `rate limiter on, ${rate}/s per coupon`,
    // The per-user bucket is set out of the way: every user grabs once, and this scenario is about the coupon's bucket.
    env: { RATE_LIMIT_ENABLED: 'true', RATE_LIMIT_PER_SECOND: String(rate), RATE_LIMIT_PER_USER_PER_SECOND: '10000' },
    limiterRate: rate,
  };
}
