import { Module } from '@nestjs/common';
import { LedgerModule } from '../ledger/ledger.module.js';
import { AdminUserCouponController } from './admin-user-coupon.controller.js';
import { AdminUserCouponService } from './admin-user-coupon.service.js';
import { ExpireCronJob } from './expire.cron.job.js';
import { ExpiryService } from './expiry.service.js';

@Module({
  imports: [LedgerModule],
  controllers: [AdminUserCouponController],
  providers: [AdminUserCouponService, ExpiryService, ExpireCronJob],
  exports: [ExpiryService],
})
export class StateMachineModule {}
