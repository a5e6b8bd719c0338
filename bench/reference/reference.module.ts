import { Controller, Headers, HttpCode, Module, Param, Post } from '@nestjs/common';
import { CurrentUser, type Principal } from '../../src/auth/principal.js';
import { IDEMPOTENCY_KEY_PATTERN, IdPipe, validationFailed } from '../../src/common/validation.js';
import { CouponModule } from '../../src/coupon/coupon.module.js';
import { LedgerModule } from '../../src/ledger/ledger.module.js';
import { toUserCouponView, UserCouponView } from '../../src/ledger/user-coupon.entity.js';
import { ReferenceDesigns } from './reference.service.js';

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
}

@Module({ imports: [CouponModule, LedgerModule], controllers: [ReferenceController], providers: [ReferenceDesigns] })
export class ReferenceModule {}
