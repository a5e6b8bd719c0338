import type { FastifyInstance, FastifyRequest, onRequestHookHandler } from 'fastify';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { asList } from '../common/route-hooks.js';
import type { SharedJson } from '../common/shared-json.js';
import { announcesBody, ID_PATTERN } from '../common/validation.js';
import type { CouponService } from './coupon.service.js';

/** What Fastify sends for an object: the same header for the answers these routes serialise themselves. */
export const JSON_TYPE = 'application/json; charset=utf-8';

/**
 * The public coupon page and the list's first page, the routes every shopper reloads during a sale,
 * answered from memory when memory holds their answer: in a hook of those two routes only, after the
 * hooks every request runs on arrival (CORS, the Host check) and before Nest's handler chain (guards,
 * pipes, the controller); the answer still gets its request id and log line (onSend, onResponse).
 * Served here is only what that chain would let through unchanged: a GET with no query string, no
 * body and a well-formed id. Everything else, and every answer that needs a read, goes to the
 * controller, which gives the same answer (public-coupon-cache.spec.ts compares them).
 */
export function servePublicReadsFromMemory(fastify: FastifyInstance, coupons: CouponService): void {
  const fromMemory: Record<string, (req: FastifyRequest) => SharedJson | undefined> = {
    '/coupons': () => coupons.heldLiveCouponsJson(DEFAULT_PAGE_LIMIT),
    '/coupons/:couponId': (req) => {
      const id = (req.params as { couponId: string }).couponId;
      return ID_PATTERN.test(id) ? coupons.heldPublicViewJson(id) : undefined;
    },
  };
  fastify.addHook('onRoute', (route) => {
    const held = Object.hasOwn(fromMemory, route.url) ? fromMemory[route.url] : undefined;
    if (route.method !== 'GET' || !held) return;
    const hook: onRequestHookHandler = (req, reply, done) => {
      const json = req.method === 'GET' && !req.url.includes('?') && !announcesBody(req) ? held(req) : undefined;
      if (!json) return done();
      void reply.header('Content-Type', JSON_TYPE);
      void reply.send(json.body(reply));
    };
    route.onRequest = [...asList(route.onRequest), hook];
  });
}
