import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { CouponModule } from '../coupon/coupon.module.js';
import { AdminUserCouponController } from './admin-user-coupon.controller.js';
import { AdminUserCouponService } from './admin-user-coupon.service.js';
import { ExpireCron } from './expire.cron.js';
import { ExpiryService } from './expiry.service.js';
import { StateLog } from './state-log.entity.js';
import { StateMachineService } from './state-machine.service.js';

// CouponModule must never import this module back: IssueService writes its issuance log row
// through the plain writeLog function for that reason.
@Module({
  imports: [TypeOrmModule.forFeature([StateLog]), CouponModule],
  controllers: [AdminUserCouponController],
  providers: [StateMachineService, AdminUserCouponService, ExpiryService, ExpireCron],
  exports: [StateMachineService, ExpiryService],
})
export class StateMachineModule {}
