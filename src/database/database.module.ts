import { Global, Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { AppConfig } from '../config/app-config.js';
import { dataSourceOptions } from './data-source-options.js';
import { LeaseService } from './lease.js';
import { PoolWarmup } from './pool-warmup.js';
import { TransactionService } from './transaction.service.js';

@Global()
@Module({
  imports: [
    TypeOrmModule.forRootAsync({
      inject: [AppConfig],
      useFactory: (config: AppConfig) => ({ ...dataSourceOptions(config), autoLoadEntities: true, retryAttempts: 0 }),
    }),
  ],
  providers: [TransactionService, LeaseService, PoolWarmup],
  exports: [TransactionService, LeaseService],
})
export class DatabaseModule {}
