import { Controller, Get, Param, Query } from '@nestjs/common';
import { ApiBearerAuth, ApiOperation, ApiTags } from '@nestjs/swagger';
import { DataSource } from 'typeorm';
import { actingFor, CurrentUser, RequireRoles, type Principal } from '../auth/principal.js';
import { AppError } from '../common/errors.js';
import { Page, toPage, DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { IdPipe, USER_ID_PATTERN, validationFailed } from '../common/validation.js';
import { toUserCouponView, UserCouponView } from '../ledger/user-coupon.entity.js';
import { findUserCoupon, listForUser, listUsableForUser } from '../ledger/user-coupons.js';
import { AdminUserCouponsQuery, MyCouponsQuery, UsableCouponsQuery } from './coupon.dto.js';
import type { Coupon } from './coupon.entity.js';
import { CouponService } from './coupon.service.js';
import { discountFor, discountOf } from './discount.js';

export interface UsableCoupon {
  userCoupon: UserCouponView;
  discountCents: number;
}

type UserCouponPage = Page<UserCouponView>;

/** Newest first. `status` filters by the status clients see (effectiveStatus: an UNUSED coupon past expiry is EXPIRED, a timed-out hold released). */
async function pageOfUserCoupons(dataSource: DataSource, userId: string, q: MyCouponsQuery): Promise<UserCouponPage> {
  const limit = q.limit ?? DEFAULT_PAGE_LIMIT;
  const now = new Date();
  const rows = await listForUser(dataSource.manager, userId, { status: q.status, beforeId: q.cursor, limit: limit + 1 }, now);
  return toPage(rows, limit, (uc) => toUserCouponView(uc, now));
}

@ApiTags('me')
@ApiBearerAuth()
@Controller('me/coupons')
export class MyCouponsController {
  constructor(
    private readonly dataSource: DataSource,
    private readonly coupons: CouponService,
  ) {}

  @Get()
  list(@Query() q: MyCouponsQuery, @CurrentUser() user: Principal): Promise<UserCouponPage> {
    return pageOfUserCoupons(this.dataSource, user.userId, q);
  }

  /**
   * The caller's coupons an order of `orderAmountCents` can use now (UNUSED as every reader sees it,
   * already valid, threshold reached), with the discount each gives, largest first, then soonest
   * expiry. One query on the user's index; the templates come from the in-memory template cache and
   * the discount from discountFor(), as holds and redemptions compute it. The order rules (one coupon
   * per order, stacking) apply when one is held or redeemed.
   */
  @Get('usable')
  async usable(@Query() q: UsableCouponsQuery, @CurrentUser() principal: Principal): Promise<{ items: UsableCoupon[] }> {
    const now = new Date();
    const mine = await listUsableForUser(this.dataSource.manager, actingFor(principal, q.userId), now);
    const templates = new Map(
      await Promise.all([...new Set(mine.map((uc) => uc.couponId))].map(async (id) => [id, await this.coupons.template(id)] as const)),
    );
    const usable = mine.flatMap((uc) => {
      const discountCents = discountFor(discountOf(templates.get(uc.couponId) as Coupon), q.orderAmountCents);
      return discountCents === null ? [] : [{ uc, discountCents }];
    });
    usable.sort(
      (a, b) =>
        b.discountCents - a.discountCents || a.uc.expiresAt.getTime() - b.uc.expiresAt.getTime() || Number(a.uc.id) - Number(b.uc.id),
    );
    return { items: usable.map((u) => ({ userCoupon: toUserCouponView(u.uc, now), discountCents: u.discountCents })) };
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
@Controller('admin')
export class AdminUserCouponsController {
  constructor(private readonly dataSource: DataSource) {}

  @Get('users/:userId/coupons')
  @ApiOperation({ summary: "A user's coupons, as GET /me/coupons shows them to that user (an unknown user has an empty list)" })
  list(@Param('userId') userId: string, @Query() q: MyCouponsQuery): Promise<UserCouponPage> {
    if (!USER_ID_PATTERN.test(userId)) throw validationFailed({ userId: ['must be 1-64 of [A-Za-z0-9_.:-]'] });
    return pageOfUserCoupons(this.dataSource, userId, q);
  }

  /**
   * The same page with the user in the query, which takes every user id: a browser resolves a path
   * segment `.` or `..` (escaped or not) before it sends, so /admin/users/../coupons arrives as
   * /admin/coupons. The console asks this one.
   */
  @Get('user-coupons')
  listByQuery(@Query() q: AdminUserCouponsQuery): Promise<UserCouponPage> {
    return pageOfUserCoupons(this.dataSource, q.userId, q);
  }
}
