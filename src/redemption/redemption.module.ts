import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { LedgerModule } from '../ledger/ledger.module.js';
import { HoldSweepCronJob } from './hold-sweep.cron.job.js';
import { HoldSweepService } from './hold-sweep.service.js';
import { HoldController } from './hold.controller.js';
import { Hold } from './hold.entity.js';
import { HoldService } from './hold.service.js';
import { RedemptionController } from './redemption.controller.js';
import { Redemption, Refund } from './redemption.entity.js';
import { RedemptionService } from './redemption.service.js';

@Module({
  imports: [TypeOrmModule.forFeature([Redemption, Refund, Hold]), LedgerModule],
  controllers: [RedemptionController, HoldController],
  providers: [RedemptionService, HoldService, HoldSweepService, HoldSweepCronJob],
  exports: [RedemptionService, HoldService, HoldSweepService],
})
export class RedemptionModule {}
