import mysql2 from 'mysql2';
import type { DatabaseHost } from '../config/app-config.js';

/** How long a host that refused a connection is left out before new connections try it again. */
export const HOST_RETRY_MS = 5000;

/**
 * A mysql2 module whose createPool spreads over several hosts, for TypeORM's `driver` option:
 * TypeORM's own replication mode sends every write to one fixed master, which is no failover for
 * a multi-writer cluster. Behind the pool TypeORM sees is a mysql2 PoolCluster with one pool per
 * host and the ORDER selector: every new connection goes to the first host that is not left out;
 * a host whose connection attempt fails is left out for HOST_RETRY_MS and the attempt moves on to
 * the next host at once. Connections to a host that dies end with it (and leave the pool); their
 * requests answer 503 or have their outcome resolved (outcome.ts), and the next ones open on a
 * live host. When the preferred host is back, new connections return to it.
 */
export function failoverDriver(hosts: DatabaseHost[]): typeof mysql2 {
  return {
    ...mysql2,
    createPool(options: mysql2.PoolOptions) {
      const cluster = mysql2.createPoolCluster({
        canRetry: true,
        removeNodeErrorCount: 1,
        restoreNodeTimeout: HOST_RETRY_MS,
        defaultSelector: 'ORDER',
      });
      for (const h of hosts) cluster.add(`${h.host}:${h.port}`, { ...options, host: h.host, port: h.port });
      const ordered = cluster.of('*', 'ORDER');
      // The two methods TypeORM's MysqlDriver calls on its pool.
      return {
        getConnection: (cb: Parameters<typeof ordered.getConnection>[0]) => ordered.getConnection(cb),
        end: (cb?: (err: NodeJS.ErrnoException | null) => void) => cluster.end(cb),
        // For the pool gauges (health/database-metrics.ts), which sum its hosts' pools.
        cluster,
      } as unknown as mysql2.Pool;
    },
  } as typeof mysql2;
}
