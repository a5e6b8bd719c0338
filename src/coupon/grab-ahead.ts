import { EXCEPTION_FILTERS_METADATA, GUARDS_METADATA, INTERCEPTORS_METADATA, PIPES_METADATA } from '@nestjs/common/constants.js';
import type { FastifyInstance, preHandlerHookHandler } from 'fastify';
import { authenticate } from '../auth/auth.guard.js';
import { PUBLIC_KEY, ROLES_KEY } from '../auth/principal.js';
import type { AppConfig } from '../config/app-config.js';
import { asList } from '../common/route-hooks.js';
import { ID_PATTERN, IDEMPOTENCY_KEY_PATTERN, isEmptyObject } from '../common/validation.js';
import { toIssuedView } from '../ledger/user-coupon.entity.js';
import { GrabController } from './grab.controller.js';
import type { GrabService } from './grab.service.js';

const GRAB_ROUTE = '/coupons/:couponId/grab';

/**
 * The grab, the route a sale's crowd presses, answered in a hook of its own route, after the hooks
 * every request runs (CORS, the Host check, the body's parser, the deadline) and before Nest's
 * handler chain (guards, pipes, the controller): the grouped grab answered 1.02-1.45x as many
 * grabs in runs alternated with the build before (BENCHMARKS.md). Served here is only a grab that
 * chain would let through unchanged: no query, no body, a valid token, a well-formed id and key.
 * Everything else goes to the controller, which answers it the same way (grab-ahead.spec.ts
 * compares them); a refusal from the service goes to the one exception filter, as the
 * controller's would.
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
      const plain =
        !req.url.includes('?') &&
        (req.body === undefined || isEmptyObject(req.body)) &&
        ID_PATTERN.test(couponId) &&
        typeof key === 'string' &&
        IDEMPOTENCY_KEY_PATTERN.test(key);
      const user = plain ? authenticate(req, config) : null;
      if (!user) return done();
      grabs
        .grab(user.userId, couponId, key as string)
        .then(({ userCoupon, replayed }) => {
          // The deadline answered first (503); the grab's outcome is left for GET /grabs/:key.
          if (reply.sent) return;
          const body = toIssuedView(userCoupon);
          if (replayed) void reply.header('Idempotent-Replayed', 'true');
          void reply.code(201).send(body);
        })
        // A throw above, or a rejection with any reason (undefined included, which done() would take
        // for "go on to the controller"), reaches the one exception filter as the controller's would.
        .catch((err: unknown) => {
          if (!reply.sent)
            done(err instanceof Error ? err : Object.assign(new Error(`Non-Error rejection: ${String(err)}`), { cause: err }));
        });
    };
    route.preHandler = [...asList(route.preHandler), hook];
  });
}
