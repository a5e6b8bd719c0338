import { Global, Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { AppConfig } from '../config/app-config.js';
import mysql2 from 'mysql2';
import type { MysqlDataSourceOptions } from 'typeorm/driver/mysql/MysqlDataSourceOptions.js';
import { dataSourceOptions } from './data-source-options.js';
import { deadlineDriver } from './deadline-pool.js';
import { LeaseService } from './lease.js';
import { PoolWarmup } from './pool-warmup.js';
import { TransactionService } from './transaction.service.js';

/** The options of a pool that serves requests: only those get the deadlines; migrations and scripts may take as long as they need. */
export function servingOptions(config: AppConfig): MysqlDataSourceOptions {
  const options = dataSourceOptions(config);
  return { ...options, driver: deadlineDriver((options.driver as typeof mysql2 | undefined) ?? mysql2, config) };
}

@Global()
@Module({
  imports: [
    TypeOrmModule.forRootAsync({
      inject: [AppConfig],
      // No retry, and toRetry says so: with retryAttempts 0 alone, @nestjs/typeorm still logs "Retrying (1)..." with a stack.
      useFactory: (config: AppConfig) => ({ ...servingOptions(config), autoLoadEntities: true, retryAttempts: 0, toRetry: () => false }),
    }),
  ],
  providers: [TransactionService, LeaseService, PoolWarmup],
  exports: [TransactionService, LeaseService],
})
export class DatabaseModule {}
