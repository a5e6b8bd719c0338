import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { CouponModule } from '../coupon/coupon.module.js';
import { StateMachineModule } from '../state-machine/state-machine.module.js';
import { RedemptionController } from './redemption.controller.js';
import { Redemption, Refund } from './redemption.entity.js';
import { RedemptionService } from './redemption.service.js';

@Module({
  imports: [TypeOrmModule.forFeature([Redemption, Refund]), CouponModule, StateMachineModule],
  controllers: [RedemptionController],
  providers: [RedemptionService],
  exports: [RedemptionService],
})
export class RedemptionModule {}
