import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { CouponStock } from './coupon-stock.entity.js';
import { IssueService } from './issue.service.js';
import { StateLog } from './state-log.entity.js';
import { StateMachineService } from './state-machine.service.js';
import { StockService } from './stock.service.js';
import { UserCoupon } from './user-coupon.entity.js';

/**
 * The ledger: user coupons, their state log and the stock row. Every other module calls it; it
 * imports none of them, so module folders depend on each other in one direction only.
 */
@Module({
  imports: [TypeOrmModule.forFeature([UserCoupon, StateLog, CouponStock])],
  providers: [StockService, IssueService, StateMachineService],
  exports: [StockService, IssueService, StateMachineService, TypeOrmModule],
})
export class LedgerModule {}
