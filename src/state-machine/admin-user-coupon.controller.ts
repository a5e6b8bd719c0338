import { Body, Controller, Get, Headers, HttpCode, Param, Post, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiHeader, ApiTags } from '@nestjs/swagger';
import type { FastifyReply } from 'fastify';
import { CurrentUser, RequireRoles } from '../auth/principal.js';
import type { Principal } from '../auth/principal.js';
import { checkIdempotencyKey, IdPipe } from '../common/validation.js';
import type { UserCouponView } from '../ledger/user-coupon.entity.js';
import { ReissueUserCouponDto, VoidUserCouponDto } from './admin-user-coupon.dto.js';
import { AdminUserCouponService, REISSUE_KEY_MAX, UserCouponHistory } from './admin-user-coupon.service.js';

@ApiTags('admin')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/user-coupons')
export class AdminUserCouponController {
  constructor(private readonly admin: AdminUserCouponService) {}

  @Post(':userCouponId/void')
  @HttpCode(200)
  void(
    @Param('userCouponId', IdPipe) id: string,
    @Body() dto: VoidUserCouponDto,
    @CurrentUser() admin: Principal,
  ): Promise<UserCouponView> {
    return this.admin.voidUserCoupon(id, dto.reason, admin.userId);
  }

  @Post('reissue')
  @HttpCode(201)
  @ApiHeader({
    name: 'Idempotency-Key',
    required: false,
    schema: { type: 'string', maxLength: REISSUE_KEY_MAX },
    description: `1-${REISSUE_KEY_MAX} of [A-Za-z0-9_-], unique per user: a repeat answers the first reissue (201, Idempotent-Replayed: true) instead of issuing again`,
  })
  async reissue(
    @Body() dto: ReissueUserCouponDto,
    @Headers('idempotency-key') key: string | undefined,
    @CurrentUser() admin: Principal,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<UserCouponView> {
    const { userCoupon, replayed } = await this.admin.reissue(
      dto,
      admin.userId,
      key === undefined ? undefined : checkIdempotencyKey(key, 'Idempotency-Key', REISSUE_KEY_MAX),
    );
    if (replayed) void reply.header('Idempotent-Replayed', 'true');
    return userCoupon;
  }

  @Get(':userCouponId/history')
  history(@Param('userCouponId', IdPipe) id: string): Promise<UserCouponHistory> {
    return this.admin.history(id);
  }
}
