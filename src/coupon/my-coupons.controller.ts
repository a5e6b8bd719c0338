import { Controller, Get, Param, Query } from '@nestjs/common';
import { ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import { InjectRepository } from '@nestjs/typeorm';
import { Repository } from 'typeorm';
import { CurrentUser, type Principal } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import { IdPipe } from '../common/validation.js';
import { MyCouponsQuery } from './coupon.dto.js';
import { toUserCouponView, UserCoupon, UserCouponView } from '../ledger/user-coupon.entity.js';

@ApiTags('me')
@ApiBearerAuth()
@Controller('me/coupons')
export class MyCouponsController {
  constructor(@InjectRepository(UserCoupon) private readonly userCoupons: Repository<UserCoupon>) {}

  /** Newest first. `status` filters by the status clients see (an UNUSED coupon past expiry is EXPIRED). */
  @Get()
  async list(@Query() q: MyCouponsQuery, @CurrentUser() user: Principal): Promise<{ items: UserCouponView[]; nextCursor: string | null }> {
    const limit = q.limit ?? 20;
    const now = new Date();
    const qb = this.userCoupons.createQueryBuilder('uc').where('uc.user_id = :userId', { userId: user.userId });
    if (q.status === 'UNUSED') qb.andWhere(`uc.status = 'UNUSED' AND uc.expires_at > :now`, { now });
    else if (q.status === 'EXPIRED') qb.andWhere(`(uc.status = 'EXPIRED' OR (uc.status = 'UNUSED' AND uc.expires_at <= :now))`, { now });
    else if (q.status) qb.andWhere('uc.status = :status', { status: q.status });
    if (q.cursor) qb.andWhere('uc.id < :cursor', { cursor: q.cursor });
    const rows = await qb
      .orderBy('uc.id', 'DESC')
      .limit(limit + 1)
      .getMany();
    const page = rows.slice(0, limit);
    return { items: page.map((uc) => toUserCouponView(uc, now)), nextCursor: rows.length > limit ? page[page.length - 1].id : null };
  }

  /** Another user's coupon is 404 too, so ids leak nothing. */
  @Get(':userCouponId')
  async one(@Param('userCouponId', IdPipe) id: string, @CurrentUser() user: Principal): Promise<UserCouponView> {
    const uc = await this.userCoupons.findOneBy({ id, userId: user.userId });
    if (!uc) throw new AppError('USER_COUPON_NOT_FOUND', 'No such coupon of yours');
    return toUserCouponView(uc);
  }
}
