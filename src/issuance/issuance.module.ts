import { Module } from '@nestjs/common';
import { CouponModule } from '../coupon/coupon.module.js';
import { LedgerModule } from '../ledger/ledger.module.js';
import { IssuanceController } from './issuance.controller.js';
import { IssuanceRunner } from './issuance-runner.js';
import { IssuanceService } from './issuance.service.js';

/** Targeted bulk issuance: jobs that issue one coupon to each user of a list. */
@Module({
  imports: [CouponModule, LedgerModule],
  controllers: [IssuanceController],
  providers: [IssuanceService, IssuanceRunner],
  exports: [IssuanceRunner],
})
export class IssuanceModule {}
