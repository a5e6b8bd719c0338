import { Injectable, OnApplicationBootstrap } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { AppConfig } from '../config/app-config.js';

/**
 * Opens the whole pool before the first request. Under a flash sale's first burst, a pool that
 * opens connections on demand makes requests wait for TCP and auth handshakes on a saturated CPU,
 * which once took longer than the connect timeout (503s on a fresh instance).
 */
@Injectable()
export class PoolWarmup implements OnApplicationBootstrap {
  constructor(
    private readonly dataSource: DataSource,
    private readonly config: AppConfig,
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    await Promise.all(Array.from({ length: this.config.DB_POOL_SIZE }, () => this.dataSource.query('SELECT 1')));
  }
}
