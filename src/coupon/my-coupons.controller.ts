import { Controller, Get, Param, Query } from '@nestjs/common';
import { ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import { DataSource } from 'typeorm';
import { CurrentUser, type Principal } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import { IdPipe } from '../common/validation.js';
import { toUserCouponView, UserCouponView } from '../ledger/user-coupon.entity.js';
import { findUserCoupon, listForUser } from '../ledger/user-coupons.js';
import { MyCouponsQuery } from './coupon.dto.js';

@ApiTags('me')
@ApiBearerAuth()
@Controller('me/coupons')
export class MyCouponsController {
  constructor(private readonly dataSource: DataSource) {}

  /** Newest first. `status` filters by the status clients see (an UNUSED coupon past expiry is EXPIRED). */
  @Get()
  async list(@Query() q: MyCouponsQuery, @CurrentUser() user: Principal): Promise<{ items: UserCouponView[]; nextCursor: string | null }> {
    const limit = q.limit ?? 20;
    const now = new Date();
    const rows = await listForUser(this.dataSource.manager, user.userId, { status: q.status, beforeId: q.cursor, limit: limit + 1 }, now);
    const page = rows.slice(0, limit);
    return { items: page.map((uc) => toUserCouponView(uc, now)), nextCursor: rows.length > limit ? page[page.length - 1].id : null };
  }

  /** Another user's coupon is 404 too, so ids leak nothing. */
  @Get(':userCouponId')
  async one(@Param('userCouponId', IdPipe) id: string, @CurrentUser() user: Principal): Promise<UserCouponView> {
    const uc = await findUserCoupon(this.dataSource.manager, id);
    if (!uc || uc.userId !== user.userId) throw new AppError('USER_COUPON_NOT_FOUND', 'No such coupon of yours');
    return toUserCouponView(uc);
  }
}
