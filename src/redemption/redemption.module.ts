import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { LedgerModule } from '../ledger/ledger.module.js';
import { RedemptionController } from './redemption.controller.js';
import { Redemption, Refund } from './redemption.entity.js';
import { RedemptionService } from './redemption.service.js';

@Module({
  imports: [TypeOrmModule.forFeature([Redemption, Refund]), LedgerModule],
  controllers: [RedemptionController],
  providers: [RedemptionService],
  exports: [RedemptionService],
})
export class RedemptionModule {}
