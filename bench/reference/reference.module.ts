import { Controller, Headers, HttpCode, Module, Param, Post } from '@nestjs/common';
import type { FastifyInstance, preHandlerHookHandler } from 'fastify';
import { authenticate } from '../../src/auth/auth.guard.js';
import { asList } from '../../src/common/route-hooks.js';
import type { AppConfig } from '../../src/config/app-config.js';
import { CurrentUser, type Principal } from '../../src/auth/principal.js';
import { IDEMPOTENCY_KEY_PATTERN, IdPipe, validationFailed } from '../../src/common/validation.js';
import { CouponModule } from '../../src/coupon/coupon.module.js';
import { LedgerModule } from '../../src/ledger/ledger.module.js';
import { toUserCouponView, UserCouponView } from '../../src/ledger/user-coupon.entity.js';
import { ReferenceDesigns } from './reference.service.js';

export const NOOP_AHEAD_ROUTE = '/noop-ahead';

function key(value: string | undefined): string {
  if (typeof value !== 'string' || !IDEMPOTENCY_KEY_PATTERN.test(value)) throw validationFailed({ 'Idempotency-Key': ['required'] });
  return value;
}

/** Same global guard, pipes and filter as the shipped routes, so only the design differs. */
@Controller()
export class ReferenceController {
  constructor(private readonly designs: ReferenceDesigns) {}

  @Post('ref/read-then-write/coupons/:couponId/grab')
  @HttpCode(201)
  async readThenWrite(
    @Param('couponId', IdPipe) couponId: string,
    @Headers('idempotency-key') k: string | undefined,
    @CurrentUser() user: Principal,
  ): Promise<UserCouponView> {
    return toUserCouponView(await this.designs.readThenWrite(couponId, user.userId, key(k)));
  }

  @Post('ref/tx-conditional/coupons/:couponId/grab')
  @HttpCode(201)
  async txConditional(
    @Param('couponId', IdPipe) couponId: string,
    @Headers('idempotency-key') k: string | undefined,
    @CurrentUser() user: Principal,
  ): Promise<UserCouponView> {
    return toUserCouponView(await this.designs.txConditional(couponId, user.userId, key(k)));
  }

  /** The ceiling: HTTP, Fastify, Nest routing and the JWT guard, and nothing else. */
  @Post('noop')
  @HttpCode(200)
  noop(@CurrentUser() user: Principal): { ok: true; userId: string } {
    return { ok: true, userId: user.userId };
  }

  /** The same, answered by answerNoopAheadOfNest below when the token is valid; this is what a bad one meets. */
  @Post(NOOP_AHEAD_ROUTE.slice(1))
  @HttpCode(200)
  noopAhead(@CurrentUser() user: Principal): { ok: true; userId: string } {
    return { ok: true, userId: user.userId };
  }
}

/**
 * The ceiling of a route answered ahead of Nest's handler chain, as the shipped grab is
 * (src/coupon/grab-ahead.ts): HTTP, Fastify's hooks and the JWT check, and nothing else.
 */
export function answerNoopAheadOfNest(fastify: FastifyInstance, config: AppConfig): void {
  fastify.addHook('onRoute', (route) => {
    if (route.url !== NOOP_AHEAD_ROUTE) return;
    const hook: preHandlerHookHandler = (req, reply, done) => {
      const user = authenticate(req, config);
      if (!user) return done();
      void reply.code(200).send({ ok: true, userId: user.userId });
    };
    route.preHandler = [...asList(route.preHandler), hook];
  });
}

@Module({ imports: [CouponModule, LedgerModule], controllers: [ReferenceController], providers: [ReferenceDesigns] })
export class ReferenceModule {}
