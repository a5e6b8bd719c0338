import type { FastifyInstance, FastifyRequest, onRequestHookHandler } from 'fastify';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { asList } from '../common/route-hooks.js';
import type { SharedJson } from '../common/shared-json.js';
import { announcesBody, ID_PATTERN, validatedSharedQuery } from '../common/validation.js';
import { PublicCouponsQuery } from './coupon.dto.js';
import type { CouponService } from './coupon.service.js';

/** What Fastify sends for an object: the same header for the answers these routes serialise themselves. */
export const JSON_TYPE = 'application/json; charset=utf-8';

/**
 * The public coupon page and list, the routes every shopper reloads during a sale, answered from
 * memory when memory holds their answer: in a hook of those two routes only, after the hooks every
 * request runs on arrival (CORS, the Host check) and before Nest's handler chain (guards, pipes, the
 * controller); the answer still gets its request id and log line (onSend, onResponse). Served here
 * is only what that chain would let through unchanged: a GET with no body, and a well-formed id
 * without a query, or a list query the validation pipe has passed before. Everything else, and
 * every answer that needs a read, goes to the controller, which gives the same answer
 * (public-coupon-cache.spec.ts compares them).
 */
export function servePublicReadsFromMemory(fastify: FastifyInstance, coupons: CouponService): void {
  const fromMemory: Record<string, (req: FastifyRequest) => SharedJson | undefined> = {
    // A query the validation pipe has already passed (the crowd sends the same few: `limit=20`, the next page's cursor).
    '/coupons': (req) => {
      const q = validatedSharedQuery(PublicCouponsQuery, req.query);
      return q && coupons.heldLiveCouponsJson(q.limit ?? DEFAULT_PAGE_LIMIT, q.cursor);
    },
    '/coupons/:couponId': (req) => {
      const id = (req.params as { couponId: string }).couponId;
      return !req.url.includes('?') && ID_PATTERN.test(id) ? coupons.heldPublicViewJson(id) : undefined;
    },
  };
  fastify.addHook('onRoute', (route) => {
    const held = Object.hasOwn(fromMemory, route.url) ? fromMemory[route.url] : undefined;
    if (route.method !== 'GET' || !held) return;
    const hook: onRequestHookHandler = (req, reply, done) => {
      const json = req.method === 'GET' && !announcesBody(req) ? held(req) : undefined;
      if (!json) return done();
      void reply.header('Content-Type', JSON_TYPE);
      void reply.send(json.body(reply));
    };
    route.onRequest = [...asList(route.onRequest), hook];
  });
}
