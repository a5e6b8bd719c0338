import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { StockModule } from '../stock/stock.module.js';
import { Coupon } from './coupon.entity.js';
import { IssueService } from './issue.service.js';
import { UserCoupon } from './user-coupon.entity.js';

@Module({
  imports: [TypeOrmModule.forFeature([Coupon, UserCoupon]), StockModule],
  providers: [IssueService],
  exports: [IssueService, TypeOrmModule],
})
export class CouponModule {}
