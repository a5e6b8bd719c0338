import { parse as parseQuery } from 'fast-querystring';
import type { FastifyInstance, FastifyRequest, onRequestHookHandler, onSendHookHandler } from 'fastify';
import type { AheadRoute } from '../common/ahead-of-fastify.js';
import { JSON_TYPE } from '../common/http-exception.filter.js';

/**
 * The page and the list may be kept, by a browser or a CDN, only if asked again before each use:
 * their remaining stock changes by the second, and with no Cache-Control a CDN applies its own
 * default lifetime (CloudFront's is a day). A shop that accepts stock a moment older at its CDN
 * sets that there.
 */
const PUBLIC_READ_CACHE_CONTROL = 'no-cache';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { asList } from '../common/route-hooks.js';
import type { SharedJson } from '../common/shared-json.js';
import { announcesBody, ID_PATTERN, validatedSharedQuery } from '../common/validation.js';
import { PublicCouponsQuery } from './coupon.dto.js';
import type { CouponService } from './coupon.service.js';

const LIST_ROUTE = '/coupons';
const PAGE_ROUTE = '/coupons/:couponId';
const PAGE_PREFIX = '/coupons/';

/** The list's answer in memory for a query as Fastify parses it, if the validation pipe has passed that query before (the crowd sends the same few: `limit=20`, the next page's cursor). */
function heldList(coupons: CouponService, query: unknown): SharedJson | undefined {
  const q = validatedSharedQuery(PublicCouponsQuery, query);
  return q && coupons.heldLiveCouponsJson(q.limit ?? DEFAULT_PAGE_LIMIT, q.cursor);
}

/** The page's answer in memory for a path id without a query (a query is refused, by the controller). */
function heldPage(coupons: CouponService, id: string): SharedJson | undefined {
  return ID_PATTERN.test(id) ? coupons.heldPublicViewJson(id) : undefined;
}

/**
 * The public coupon page and list, the routes every shopper reloads during a sale, answered from
 * memory when memory holds their answer. Served from memory is only what Nest's handler chain would
 * let through unchanged: a GET with no body, and a well-formed id without a query, or a list query
 * the validation pipe has passed before. Everything else, and every answer that needs a read, goes
 * to the controller, which gives the same answer (public-coupon-cache.spec.ts compares them).
 *
 * Two ways, the first taken when it can be:
 * - ahead of Fastify (publicReadsAheadOfFastify below), for a request without an Origin or on a
 *   server without CORS: it made the page 1.3-2.0x as fast under wrk (BENCHMARKS.md);
 * - in a hook of the two routes (this one), after the hooks every request runs on arrival (CORS,
 *   the Host check) and before Nest's handler chain (guards, pipes, the controller).
 */
export function servePublicReadsFromMemory(fastify: FastifyInstance, coupons: CouponService): void {
  const fromMemory: Record<string, (req: FastifyRequest) => SharedJson | undefined> = {
    [LIST_ROUTE]: (req) => heldList(coupons, req.query),
    [PAGE_ROUTE]: (req) => (req.url.includes('?') ? undefined : heldPage(coupons, (req.params as { couponId: string }).couponId)),
  };
  // Every answer of the two routes through Fastify: from memory, from the controller, and refused by
  // a hook before either (a repeated or malformed query, a body), which a CDN that keeps errors kept.
  const noCache: onSendHookHandler = (_req, reply, payload, done) => {
    void reply.header('Cache-Control', PUBLIC_READ_CACHE_CONTROL);
    done(null, payload);
  };
  fastify.addHook('onRoute', (route) => {
    const held = Object.hasOwn(fromMemory, route.url) ? fromMemory[route.url] : undefined;
    if (!held || (route.method !== 'GET' && route.method !== 'HEAD')) return;
    route.onSend = [...asList(route.onSend), noCache];
    if (route.method !== 'GET') return;
    const hook: onRequestHookHandler = (req, reply, done) => {
      const json = req.method === 'GET' && !announcesBody(req) ? held(req) : undefined;
      if (!json) return done();
      void reply.header('Content-Type', JSON_TYPE);
      void reply.send(json.body(reply));
    };
    route.onRequest = [...asList(route.onRequest), hook];
  });
}

/**
 * The page and list ahead of Fastify (ahead-of-fastify.ts): a GET whose answer memory holds, for the
 * URL as Fastify would route and parse it.
 */
export function publicReadsAheadOfFastify(coupons: CouponService): AheadRoute {
  const held = (url: string): { route: string; json: SharedJson } | undefined => {
    const q = url.indexOf('?');
    const path = q === -1 ? url : url.slice(0, q);
    if (path === LIST_ROUTE) {
      // Fastify's query parser (find-my-way's): an empty query string is an empty object.
      const query = q === -1 || q === url.length - 1 ? {} : parseQuery(url.slice(q + 1));
      const json = heldList(coupons, query);
      return json && { route: LIST_ROUTE, json };
    }
    if (q !== -1 || !path.startsWith(PAGE_PREFIX)) return undefined;
    const json = heldPage(coupons, path.slice(PAGE_PREFIX.length));
    return json && { route: PAGE_ROUTE, json };
  };
  const plain = { 'content-type': JSON_TYPE, 'cache-control': PUBLIC_READ_CACHE_CONTROL, vary: 'Accept-Encoding' };
  const gzipped = { ...plain, 'content-encoding': 'gzip' };
  return (req) => {
    const found = req.method === 'GET' ? held(req.url as string) : undefined;
    if (!found) return undefined;
    const { bytes, gzip } = found.json.encodedFor(req.headers['accept-encoding']);
    return { route: found.route, take: (x) => x.send(200, gzip ? gzipped : plain, bytes) };
  };
}
