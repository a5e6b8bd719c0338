import { Injectable, Logger, OnModuleDestroy, OnModuleInit } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { gauge } from '../common/metrics.js';
import { StockService } from '../ledger/stock.service.js';

/** The three queues mysql2's getConnection() itself reads; it keeps no public counters. */
interface PoolQueues {
  _allConnections: { length: number };
  _freeConnections: { length: number };
  _connectionQueue: { length: number };
}
/** The wrappers around it: deadline-pool.ts's (`inner`) and failover-pool.ts's PoolCluster, one pool per host. */
interface WrappedPool {
  inner?: unknown;
  cluster?: { _nodes: Record<string, { pool: PoolQueues }> };
}

function queuesOf(pool: unknown): PoolQueues[] {
  if (pool === null || typeof pool !== 'object') return [];
  if ('_allConnections' in pool) return [pool as PoolQueues];
  const { inner, cluster } = pool as WrappedPool;
  if (cluster) return Object.values(cluster._nodes).map((n) => n.pool);
  return queuesOf(inner);
}

const poolsOf = (dataSource: DataSource): PoolQueues[] => queuesOf((dataSource.driver as unknown as { pool?: unknown }).pool);

/** The app whose database the next scrape reads (one per process outside tests; the last one started). */
const scraped: { app?: DatabaseMetrics } = {};
const logger = new Logger('Metrics');

/** Read at scrape time, not maintained per request: a grab pays nothing for them. */
gauge('db_pool_connections', 'Connections of the database pool, by state (in_use: lent to a query or transaction)', ['state'], function () {
  this.reset();
  const pools = scraped.app ? poolsOf(scraped.app.dataSource) : [];
  const sum = (f: (p: PoolQueues) => number) => pools.reduce((n, p) => n + f(p), 0);
  this.set(
    { state: 'in_use' },
    sum((p) => p._allConnections.length - p._freeConnections.length),
  );
  this.set(
    { state: 'idle' },
    sum((p) => p._freeConnections.length),
  );
});
gauge('db_pool_waiting_requests', 'Requests waiting for a free connection of the database pool', [], function () {
  this.set(scraped.app ? poolsOf(scraped.app.dataSource).reduce((n, p) => n + p._connectionQueue.length, 0) : 0);
});
gauge(
  'coupon_remaining_stock',
  'Remaining stock of each coupon whose grab window is open or ended within a day (kept from the last scrape while the pool has no idle connection)',
  ['coupon_id'],
  async function () {
    // The scrape never queues for a connection a grab is waiting for: with none idle, the
    // previous values stay (a sale's dashboard lags a few seconds rather than slowing the sale).
    const app = scraped.app;
    if (!app || poolsOf(app.dataSource).every((p) => p._freeConnections.length === 0)) return;
    try {
      const rows = await app.stock.remainingOfCurrent(app.dataSource.manager);
      this.reset();
      for (const { couponId, stock } of rows) this.set({ coupon_id: couponId }, stock);
    } catch (err) {
      // /metrics still answers (with the other metrics) while the database does not.
      logger.warn(`coupon_remaining_stock not collected: ${(err as Error).message}`);
    }
  },
);

@Injectable()
export class DatabaseMetrics implements OnModuleInit, OnModuleDestroy {
  constructor(
    readonly dataSource: DataSource,
    readonly stock: StockService,
  ) {}

  onModuleInit(): void {
    scraped.app = this;
  }

  onModuleDestroy(): void {
    if (scraped.app === this) delete scraped.app;
  }
}
