import { Global, Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { AppConfig } from '../config/app-config.js';
import mysql2 from 'mysql2';
import { dataSourceOptions } from './data-source-options.js';
import { deadlineDriver } from './deadline-pool.js';
import { LeaseService } from './lease.js';
import { PoolWarmup } from './pool-warmup.js';
import { TransactionService } from './transaction.service.js';

@Global()
@Module({
  imports: [
    TypeOrmModule.forRootAsync({
      inject: [AppConfig],
      useFactory: (config: AppConfig) => {
        const options = dataSourceOptions(config);
        // Only the serving pool gets the deadlines: migrations and scripts may take as long as they need.
        const driver = deadlineDriver((options.driver as typeof mysql2 | undefined) ?? mysql2, config);
        // No retry, and toRetry says so: with retryAttempts 0 alone, @nestjs/typeorm still logs "Retrying (1)..." with a stack.
        return { ...options, driver, autoLoadEntities: true, retryAttempts: 0, toRetry: () => false };
      },
    }),
  ],
  providers: [TransactionService, LeaseService, PoolWarmup],
  exports: [TransactionService, LeaseService],
})
export class DatabaseModule {}
