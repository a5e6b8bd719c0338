import { Controller, Headers, HttpCode, Module, Param, Post } from '@nestjs/common';
import { principalOf } from '../../src/auth/auth.guard.js';
import type { AheadRoute } from '../../src/common/ahead-of-fastify.js';
import { JSON_TYPE } from '../../src/common/http-exception.filter.js';
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

  /** The same, answered by noopAheadOfFastify below when the token is valid; this is what a bad one meets. */
  @Post(NOOP_AHEAD_ROUTE.slice(1))
  @HttpCode(200)
  noopAhead(@CurrentUser() user: Principal): { ok: true; userId: string } {
    return { ok: true, userId: user.userId };
  }
}

/**
 * The ceiling of a route answered ahead of Fastify, as the shipped grab is (src/coupon/grab-ahead.ts):
 * HTTP, the JWT check, the request id, the log line and the metric, and nothing else.
 */
export function noopAheadOfFastify(config: AppConfig): AheadRoute {
  return (req) => {
    const user = req.method === 'POST' && req.url === NOOP_AHEAD_ROUTE ? principalOf(req, config) : null;
    if (!user) return undefined;
    const body = JSON.stringify({ ok: true, userId: user.userId });
    return { route: NOOP_AHEAD_ROUTE, take: (x) => x.send(200, { 'content-type': JSON_TYPE }, body) };
  };
}

@Module({ imports: [CouponModule, LedgerModule], controllers: [ReferenceController], providers: [ReferenceDesigns] })
export class ReferenceModule {}
