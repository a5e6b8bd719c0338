import { Controller, Get, Param, Query } from '@nestjs/common';
import { ApiBearerAuth, ApiOperation, ApiTags } from '@nestjs/swagger';
import { DataSource } from 'typeorm';
import { CurrentUser, RequireRoles, type Principal } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import { Page, toPage } from '../common/page.js';
import { IdPipe, USER_ID_PATTERN, validationFailed } from '../common/validation.js';
import { toUserCouponView, UserCouponView } from '../ledger/user-coupon.entity.js';
import { findUserCoupon, listForUser } from '../ledger/user-coupons.js';
import { MyCouponsQuery } from './coupon.dto.js';

type UserCouponPage = Page<UserCouponView>;

/** Newest first. `status` filters by the status clients see (an UNUSED coupon past expiry is EXPIRED). */
async function pageOfUserCoupons(dataSource: DataSource, userId: string, q: MyCouponsQuery): Promise<UserCouponPage> {
  const limit = q.limit ?? 20;
  const now = new Date();
  const rows = await listForUser(dataSource.manager, userId, { status: q.status, beforeId: q.cursor, limit: limit + 1 }, now);
  return toPage(rows, limit, (uc) => toUserCouponView(uc, now));
}

@ApiTags('me')
@ApiBearerAuth()
@Controller('me/coupons')
export class MyCouponsController {
  constructor(private readonly dataSource: DataSource) {}

  @Get()
  list(@Query() q: MyCouponsQuery, @CurrentUser() user: Principal): Promise<UserCouponPage> {
    return pageOfUserCoupons(this.dataSource, user.userId, q);
  }

  /** Another user's coupon is 404 too, so ids leak nothing. */
  @Get(':userCouponId')
  async one(@Param('userCouponId', IdPipe) id: string, @CurrentUser() user: Principal): Promise<UserCouponView> {
    const uc = await findUserCoupon(this.dataSource.manager, id);
    if (!uc || uc.userId !== user.userId) throw new AppError('USER_COUPON_NOT_FOUND', 'No such coupon of yours');
    return toUserCouponView(uc);
  }
}

@ApiTags('admin')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/users')
export class AdminUserCouponsController {
  constructor(private readonly dataSource: DataSource) {}

  @Get(':userId/coupons')
  @ApiOperation({ summary: "A user's coupons, as GET /me/coupons shows them to that user (an unknown user has an empty list)" })
  list(@Param('userId') userId: string, @Query() q: MyCouponsQuery): Promise<UserCouponPage> {
    if (!USER_ID_PATTERN.test(userId)) throw validationFailed({ userId: ['must be 1-64 of [A-Za-z0-9_.:-]'] });
    return pageOfUserCoupons(this.dataSource, userId, q);
  }
}
