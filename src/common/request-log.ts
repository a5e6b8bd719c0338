import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { ErrorCode } from './errors.js';
import { counter, httpDuration } from './metrics.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by the exception filter: the code answered. */
    errorCode?: ErrorCode;
  }
}

export const GRAB_ROUTE = '/coupons/:couponId/grab';

const grabOutcomes = counter('coupon_grab_outcomes_total', 'Grab answers by coupon and outcome (GRANTED, REPLAYED or the error code)', [
  'coupon_id',
  'outcome',
]);

/**
 * A grab answered with these statuses got past the coupon lookup, so its id names a real coupon;
 * any other (400, 401, 404, 503) may carry whatever id a client typed, which must not become a label.
 */
const KNOWN_COUPON_STATUSES = new Set([201, 409, 422, 429]);

/** One line per request, after the answer: what was asked, by whom, what was answered, how fast. */
export function onResponse(req: FastifyRequest, reply: FastifyReply): void {
  const route = req.routeOptions.url ?? 'unmatched';
  const status = reply.statusCode;
  httpDuration.observe({ method: req.method, route, status: String(status) }, reply.elapsedTime / 1000);
  if (route === GRAB_ROUTE) {
    const couponId = KNOWN_COUPON_STATUSES.has(status) ? (req.params as { couponId: string }).couponId : 'unknown';
    const outcome = req.errorCode ?? (reply.getHeader('idempotent-replayed') === 'true' ? 'REPLAYED' : 'GRANTED');
    grabOutcomes.inc({ coupon_id: couponId, outcome });
  }
  const level = status >= 500 ? 'error' : 'info';
  // The app's logger is pino (app.factory.ts); skipping the line's object when it is off costs a benchmark nothing.
  if (!(req.log as Logger).isLevelEnabled(level)) return;
  req.log[level](
    {
      method: req.method,
      url: req.url,
      route,
      status,
      ...(req.errorCode ? { code: req.errorCode } : {}),
      ...(req.principal ? { user: req.principal.userId } : {}),
      ms: Math.round(reply.elapsedTime * 10) / 10,
    },
    'request',
  );
}
