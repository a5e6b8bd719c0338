import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { CouponStock } from '../stock/coupon-stock.entity.js';
import { StockModule } from '../stock/stock.module.js';
import { AdminCouponController, CouponController } from './coupon.controller.js';
import { Coupon } from './coupon.entity.js';
import { CouponService } from './coupon.service.js';
import { GrabController } from './grab.controller.js';
import { GrabGroupService } from './grab-group.service.js';
import { GrabService } from './grab.service.js';
import { IssueService } from './issue.service.js';
import { MyCouponsController } from './my-coupons.controller.js';
import { UserCoupon } from './user-coupon.entity.js';

@Module({
  imports: [TypeOrmModule.forFeature([Coupon, UserCoupon, CouponStock]), StockModule],
  controllers: [CouponController, AdminCouponController, GrabController, MyCouponsController],
  providers: [IssueService, CouponService, GrabService, GrabGroupService],
  exports: [IssueService, CouponService, TypeOrmModule],
})
export class CouponModule {}
