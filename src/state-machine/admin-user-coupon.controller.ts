import { Body, Controller, Get, HttpCode, Param, Post } from '@nestjs/common';
import { ApiBearerAuth, ApiConflictResponse, ApiNotFoundResponse, ApiOkResponse, ApiTags } from '@nestjs/swagger';
import { CurrentUser, RequireRoles } from '../auth/principal.js';
import type { Principal } from '../auth/principal.js';
import { IdPipe } from '../common/validation.js';
import type { UserCouponView } from '../coupon/user-coupon.entity.js';
import { ReissueUserCouponDto, UserCouponHistoryView, VoidUserCouponDto } from './admin-user-coupon.dto.js';
import { AdminUserCouponService, UserCouponHistory } from './admin-user-coupon.service.js';

@ApiTags('admin')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/user-coupons')
export class AdminUserCouponController {
  constructor(private readonly admin: AdminUserCouponService) {}

  @Post(':userCouponId/void')
  @HttpCode(200)
  @ApiOkResponse({ description: 'The voided UserCoupon' })
  @ApiNotFoundResponse({ description: 'USER_COUPON_NOT_FOUND' })
  @ApiConflictResponse({ description: 'ILLEGAL_TRANSITION: already USED or VOID' })
  void(@Param('userCouponId', IdPipe) id: string, @Body() dto: VoidUserCouponDto, @CurrentUser() admin: Principal): Promise<UserCouponView> {
    return this.admin.voidUserCoupon(id, dto.reason, admin.userId);
  }

  @Post('reissue')
  @HttpCode(201)
  @ApiNotFoundResponse({ description: 'COUPON_NOT_FOUND, or USER_COUPON_NOT_FOUND for replacesUserCouponId' })
  @ApiConflictResponse({ description: 'SOLD_OUT (fromStock with no stock left)' })
  reissue(@Body() dto: ReissueUserCouponDto, @CurrentUser() admin: Principal): Promise<UserCouponView> {
    return this.admin.reissue(dto, admin.userId);
  }

  @Get(':userCouponId/history')
  @ApiOkResponse({ type: UserCouponHistoryView })
  @ApiNotFoundResponse({ description: 'USER_COUPON_NOT_FOUND' })
  history(@Param('userCouponId', IdPipe) id: string): Promise<UserCouponHistory> {
    return this.admin.history(id);
  }
}
