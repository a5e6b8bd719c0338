import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { StateLog } from './state-log.entity.js';
import { StateMachineService } from './state-machine.service.js';

@Module({
  imports: [TypeOrmModule.forFeature([StateLog])],
  providers: [StateMachineService],
  exports: [StateMachineService],
})
export class StateMachineModule {}
