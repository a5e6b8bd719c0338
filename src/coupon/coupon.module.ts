import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { LedgerModule } from '../ledger/ledger.module.js';
import { AdminCouponController, CouponController } from './coupon.controller.js';
import { Coupon } from './coupon.entity.js';
import { CouponService } from './coupon.service.js';
import { GrabController } from './grab.controller.js';
import { GrabGroupService } from './grab-group.service.js';
import { GrabSeries } from './grab-series.js';
import { GrabService } from './grab.service.js';
import { AdminUserCouponsController, MyCouponsController } from './my-coupons.controller.js';

@Module({
  imports: [TypeOrmModule.forFeature([Coupon]), LedgerModule],
  controllers: [CouponController, AdminCouponController, GrabController, MyCouponsController, AdminUserCouponsController],
  providers: [CouponService, GrabService, GrabGroupService, GrabSeries],
  exports: [CouponService, TypeOrmModule],
})
export class CouponModule {}
