import type { IncomingMessage, RequestListener, Server } from 'node:http';
import { parse as parseQuery } from 'fast-querystring';
import type { FastifyInstance, FastifyRequest, onRequestHookHandler } from 'fastify';
import type { Logger } from 'pino';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { logRequest, requestIdOf } from '../common/request-log.js';
import { asList } from '../common/route-hooks.js';
import type { SharedJson } from '../common/shared-json.js';
import { announcesBody, ID_PATTERN, validatedSharedQuery } from '../common/validation.js';
import { PublicCouponsQuery } from './coupon.dto.js';
import type { CouponService } from './coupon.service.js';

/** What Fastify sends for an object: the same header for the answers these routes serialise themselves. */
export const JSON_TYPE = 'application/json; charset=utf-8';

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
 * - ahead of Fastify (answerAheadOfFastify), for a request without an Origin or on a server
 *   without CORS: skipping Fastify's own work for a request (its request and reply, routing, the
 *   hooks, the reply's headers) took the page's server CPU per answer from 0.10-0.12 ms to
 *   0.07-0.08, and made it 1.3-2.0x as fast under wrk (BENCHMARKS.md);
 * - in a hook of the two routes, after the hooks every request runs on arrival (CORS, the Host
 *   check) and before Nest's handler chain (guards, pipes, the controller).
 */
export function servePublicReadsFromMemory(fastify: FastifyInstance, coupons: CouponService, options: AheadOfFastify): void {
  answerAheadOfFastify(fastify.server, coupons, options);
  const fromMemory: Record<string, (req: FastifyRequest) => SharedJson | undefined> = {
    [LIST_ROUTE]: (req) => heldList(coupons, req.query),
    [PAGE_ROUTE]: (req) => (req.url.includes('?') ? undefined : heldPage(coupons, (req.params as { couponId: string }).couponId)),
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

/** The route and the answer memory holds for a GET of this URL, as Fastify would route and parse it; undefined when not both. */
function heldForUrl(coupons: CouponService, url: string): { route: string; json: SharedJson } | undefined {
  // Fastify's router also ends the path at '#', and decodes %-escapes: those are left to it.
  if (url.includes('#') || url.includes('%')) return undefined;
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
}

export interface AheadOfFastify {
  /** The server is closing: its refusal of a new request is Fastify's to answer. */
  isClosing(): boolean;
  /** CORS_ORIGINS is set: an answer varies on Origin, and a request with one is left to the CORS hook. */
  cors: boolean;
  /** The app's logger, whose request lines these answers' lines must match. */
  log: Logger;
}

/**
 * Answers the public page and list in the server's own request listener, before Fastify's: with the
 * headers Fastify's way gives the same request (Content-Type, Vary, Content-Encoding, X-Request-Id),
 * its log line and its duration metric. Only what no hook of Fastify's way would change: a GET with
 * a Host and no body, no Origin where CORS is on, while the server is not closing.
 */
function answerAheadOfFastify(server: Server, coupons: CouponService, options: AheadOfFastify): void {
  const listeners = server.listeners('request') as RequestListener[];
  if (listeners.length !== 1) throw new Error(`public-reads.ts expects Fastify's request listener alone, found ${listeners.length}`);
  const [fastifyListener] = listeners;
  const vary = options.cors ? 'Origin, Accept-Encoding' : 'Accept-Encoding';
  const fromMemory = (req: IncomingMessage) => {
    const plain =
      req.method === 'GET' &&
      req.url !== undefined &&
      req.headers.host !== undefined &&
      !(options.cors && req.headers.origin !== undefined) &&
      !announcesBody(req) &&
      !options.isClosing();
    const held = plain ? heldForUrl(coupons, req.url as string) : undefined;
    return held && { route: held.route, ...held.json.encodedFor(req.headers['accept-encoding']) };
  };
  server.removeListener('request', fastifyListener);
  server.on('request', (req, res) => {
    const arrived = performance.now();
    let answer: ReturnType<typeof fromMemory>;
    try {
      answer = fromMemory(req);
    } catch {
      // Thrown in this listener it would end the process; Fastify's way answers it with the filter's 500.
      answer = undefined;
    }
    if (!answer) return fastifyListener.call(server, req, res);
    const id = requestIdOf(req);
    const { route, bytes, gzip } = answer;
    res.writeHead(200, {
      'content-type': JSON_TYPE,
      vary,
      ...(gzip ? { 'content-encoding': 'gzip' } : {}),
      'x-request-id': id,
      'content-length': bytes.length,
    });
    // Once written, as Fastify logs: an answer queued behind a pipelined one and lost with its connection is none.
    res.once('finish', () =>
      logRequest(options.log, { method: 'GET', url: req.url as string, route, status: 200, ms: performance.now() - arrived }, id),
    );
    res.end(bytes);
  });
}
