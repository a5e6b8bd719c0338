import { Controller, Get, Headers, HttpCode, Param, Post, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiHeader, ApiTags } from '@nestjs/swagger';
import type { FastifyReply } from 'fastify';
import { CurrentUser, type Principal } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import { checkIdempotencyKey, IdPipe } from '../common/validation.js';
import { GrabService, issuedAnswer } from './grab.service.js';
import { toUserCouponView, UserCouponView } from '../ledger/user-coupon.entity.js';

@ApiTags('grab')
@ApiBearerAuth()
@Controller()
export class GrabController {
  constructor(private readonly grabs: GrabService) {}

  /** 201 with the coupon as issued; a replay of the same key answers the same body, with Idempotent-Replayed: true. */
  @Post('coupons/:couponId/grab')
  @HttpCode(201)
  @ApiHeader({ name: 'Idempotency-Key', required: true, description: '1-128 of [A-Za-z0-9_-], unique per grab attempt' })
  async grab(
    @Param('couponId', IdPipe) couponId: string,
    @Headers('idempotency-key') key: string | undefined,
    @CurrentUser() user: Principal,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<UserCouponView> {
    const answer = issuedAnswer(await this.grabs.grab(user.userId, couponId, checkIdempotencyKey(key, 'Idempotency-Key')));
    void reply.headers(answer.headers);
    return answer.body;
  }

  /** Lets a client whose grab timed out learn whether it got the coupon. */
  @Get('grabs/:idempotencyKey')
  async find(@Param('idempotencyKey') key: string, @CurrentUser() user: Principal): Promise<UserCouponView> {
    const uc = await this.grabs.byKey(user.userId, checkIdempotencyKey(key, 'idempotencyKey'));
    if (!uc) throw new AppError('GRAB_NOT_FOUND', 'No coupon was issued to you under this key');
    return toUserCouponView(uc);
  }
}
