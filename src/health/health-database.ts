import { Injectable, OnApplicationShutdown, OnModuleInit } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { AppConfig } from '../config/app-config.js';
import { servingOptions } from '../database/database.module.js';

/**
 * The database as /health asks it: on a connection of its own, not one of the serving pool's. With
 * the pool busy (a sale's grabs on every connection, requests queueing for one) the ping would wait
 * past its timeout, and a load balancer reading 503 would take every instance out at the peak. How
 * busy the pool is, /metrics tells. So /health says whether the database answers this instance, not
 * whether the pool's own connections do; with DB_HOSTS this connection fails over on its own.
 */
@Injectable()
export class HealthDatabase implements OnModuleInit, OnApplicationShutdown {
  readonly dataSource: DataSource;

  constructor(config: AppConfig) {
    this.dataSource = new DataSource({ ...servingOptions(config), poolSize: 1, migrations: [] });
  }

  async onModuleInit(): Promise<void> {
    await this.dataSource.initialize();
  }

  async onApplicationShutdown(): Promise<void> {
    if (this.dataSource.isInitialized) await this.dataSource.destroy();
  }
}
