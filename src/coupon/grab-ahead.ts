import { EXCEPTION_FILTERS_METADATA, GUARDS_METADATA, INTERCEPTORS_METADATA, PIPES_METADATA } from '@nestjs/common/constants.js';
import type { FastifyInstance, preHandlerHookHandler } from 'fastify';
import { authenticate, principalOf } from '../auth/auth.guard.js';
import { PUBLIC_KEY, ROLES_KEY } from '../auth/principal.js';
import type { AppConfig } from '../config/app-config.js';
import type { AheadExchange, AheadRoute } from '../common/ahead-of-fastify.js';
import { asError } from '../common/errors.js';
import { deadlinePassed, JSON_TYPE } from '../common/http-exception.filter.js';
import { asList } from '../common/route-hooks.js';
import { deadlineOf, settleDeadline, withDeadline } from '../database/deadline-pool.js';
import { ID_PATTERN, IDEMPOTENCY_KEY_PATTERN, isEmptyObject } from '../common/validation.js';
import { GrabController } from './grab.controller.js';
import { type GrabResult, type GrabService, issuedAnswer } from './grab.service.js';

const GRAB_ROUTE = '/coupons/:couponId/grab';
const GRAB_PREFIX = '/coupons/';
const GRAB_SUFFIX = '/grab';

/** A well-formed coupon id and Idempotency-Key: with a valid token, what both ways below take (the controller answers the rest). */
function isPlainGrab(couponId: string, key: string | string[] | undefined): key is string {
  return ID_PATTERN.test(couponId) && typeof key === 'string' && IDEMPOTENCY_KEY_PATTERN.test(key);
}

/**
 * The grab, the route a sale's crowd presses, answered ahead of the framework when it is plain: no
 * query, no body, a valid token, a well-formed id and key. Everything else goes to the controller,
 * which answers it the same way (grab-ahead.spec.ts compares them); a refusal from the service
 * gets the one exception filter's answer, as the controller's would. Two ways, the first taken
 * when it can be:
 * - ahead of Fastify (grabsAheadOfFastify below), for a request without an Origin or on a server
 *   without CORS;
 * - in a hook of its route (this one), after the hooks every request runs (CORS, the Host check,
 *   the body's parser, the deadline) and before Nest's handler chain (guards, pipes, the
 *   controller): the grouped grab answered 1.02-1.45x as many grabs in runs alternated with the
 *   build before (BENCHMARKS.md).
 */
export function answerGrabsAheadOfNest(fastify: FastifyInstance, grabs: GrabService, config: AppConfig): void {
  // The hook checks the token as the guard does for a route open to every role, and runs nothing
  // else of Nest's chain: a route (or its controller) made public, given roles, or its own guards,
  // interceptors, pipes or filters would be answered here without them.
  for (const key of [PUBLIC_KEY, ROLES_KEY, GUARDS_METADATA, INTERCEPTORS_METADATA, PIPES_METADATA, EXCEPTION_FILTERS_METADATA]) {
    for (const target of [GrabController, GrabController.prototype.grab]) {
      if (Reflect.getMetadata(key, target) !== undefined) throw new Error(`grab-ahead.ts does not apply ${key} of the grab route`);
    }
  }
  fastify.addHook('onRoute', (route) => {
    if (route.url !== GRAB_ROUTE || route.method !== 'POST') return;
    const hook: preHandlerHookHandler = (req, reply, done) => {
      const { couponId } = req.params as { couponId: string };
      const key = req.headers['idempotency-key'];
      const plain = !req.url.includes('?') && (req.body === undefined || isEmptyObject(req.body)) && isPlainGrab(couponId, key);
      const user = plain && authenticate(req, config);
      if (!plain || !user) return done();
      grabs
        .grab(user.userId, couponId, key)
        .then((result) => {
          // The deadline answered first (503); the grab's outcome is left for GET /grabs/:key.
          if (reply.sent) return;
          const answer = issuedAnswer(result);
          void reply.headers(answer.headers).code(201).send(answer.body);
        })
        // A throw above, or a rejection with any reason (undefined included, which done() would take
        // for "go on to the controller"), reaches the one exception filter as the controller's would.
        .catch((err: unknown) => {
          if (!reply.sent) done(asError(err));
        });
    };
    route.preHandler = [...asList(route.preHandler), hook];
  });
}

/**
 * The grab ahead of Fastify (ahead-of-fastify.ts), for the same plain grab as the hook above, by
 * the URL as sent: no query, a well-formed id and key, a valid token. It runs under the deadline
 * the hooks of Fastify's way set (REQUEST_TIMEOUT_MS, 503 when it passes) and answers as the hook
 * does (grab-ahead.spec.ts compares them).
 */
export function grabsAheadOfFastify(grabs: GrabService, config: AppConfig): AheadRoute {
  return (req) => {
    const url = req.url as string;
    if (req.method !== 'POST' || !url.startsWith(GRAB_PREFIX) || !url.endsWith(GRAB_SUFFIX)) return undefined;
    const couponId = url.slice(GRAB_PREFIX.length, -GRAB_SUFFIX.length);
    const key = req.headers['idempotency-key'];
    if (!isPlainGrab(couponId, key)) return undefined;
    const user = principalOf(req, config);
    if (!user) return undefined;
    return {
      route: GRAB_ROUTE,
      take: (x) => {
        x.user = user.userId;
        answerGrab(x, config.REQUEST_TIMEOUT_MS, () => grabs.grab(user.userId, couponId, key));
      },
    };
  };
}

function answerGrab(x: AheadExchange, timeoutMs: number, grab: () => Promise<GrabResult>): void {
  const deadline = deadlineOf(timeoutMs);
  const timer = setTimeout(() => x.fail(deadlinePassed()), timeoutMs);
  // The request's close, as Fastify's deadline: a pipelined answer whose connection went never gets a socket to close.
  x.req.once('close', () => clearTimeout(timer));
  x.res.once('close', () => clearTimeout(timer));
  x.res.once('finish', () => settleDeadline(deadline, x.res.statusCode));
  withDeadline(deadline, () => {
    grab()
      .then((result) => {
        const { headers, body } = issuedAnswer(result);
        headers['content-type'] = JSON_TYPE;
        x.send(201, headers, JSON.stringify(body));
      })
      .catch((err: unknown) => x.fail(err));
  });
}
