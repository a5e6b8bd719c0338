import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import mysql from 'mysql2/promise';
import { errnoOf } from '../common/db-errors.js';
import { type AppConfig, databaseHosts } from '../config/app-config.js';

/** A writer of this database open before the check's own transaction: its InnoDB id and start (unix seconds). */
export interface Writer {
  id: string;
  started: number;
}

/**
 * In a READ COMMITTED transaction the caller has begun: a write (the caller rolls it back) that gives
 * the transaction an InnoDB id, then the writers of this database listed before it. 'stale' unless
 * the list was built by this very statement: innodb_trx is a cache that InnoDB rebuilds only after
 * 100 ms without a read, and a list from before this transaction began is no evidence. The list's
 * own row shows the statement running when it was built, so the statement carries a token of its
 * own. (Matching the connection alone trusted a list built during an earlier check on the same
 * pooled connection, kept by another reader polling the view: it showed no writer, and gaps whose
 * writers were open were abandoned.) Read-only transactions are listed with ids above every real
 * one, so they never count.
 */
export async function writersBefore(query: (sql: string) => Promise<unknown>): Promise<Writer[] | 'stale'> {
  await query(`UPDATE webhook_relay_cursor SET updated_at = UTC_TIMESTAMP(3) WHERE name = 'relay'`);
  const token = `writers-check-${randomUUID()}`;
  const rows = (await query(
    `SELECT CAST(t.trx_id AS CHAR) AS id, t.trx_mysql_thread_id = CONNECTION_ID() AND LOCATE('${token}', t.trx_query) > 0 AS mine,
            UNIX_TIMESTAMP(t.trx_started) AS started
     FROM information_schema.innodb_trx t JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
     WHERE p.db = DATABASE()`,
  )) as { id: string; mine: string | number | null; started: string | number }[];
  const mine = rows.find((r) => Number(r.mine) === 1);
  if (mine === undefined) return 'stale';
  return rows.filter((r) => BigInt(r.id) < BigInt(mine.id)).map((r) => ({ id: r.id, started: Math.floor(Number(r.started)) }));
}

/** The number of nodes of the Galera cluster the connection's server is in; 0 when it is not a Galera node. */
export async function clusterSize(db: { query(sql: string): Promise<unknown> }): Promise<number> {
  const rows = (await db.query(`SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'`)) as { Value: string }[];
  return Number(rows[0]?.Value ?? 0);
}

interface NodeAnswer {
  node: string;
  size: number;
  writers: Set<string>;
}

/** How long one node may take to answer a statement of the check (a causal read waits for the node to catch up). */
const NODE_TIMEOUT_MS = 2000;
/** Complete checks kept for comparison: about a minute of them; past that, gaps fall back on their age. */
const HISTORY = 240;

/**
 * The open-writer check of a Galera cluster. Each node lists only its own transactions in
 * innodb_trx, and a node that has not yet applied a row committed on another one still takes ids
 * below it from its own AUTO_INCREMENT: the writer of a gap's id may be open on another node, and
 * may even have begun after the gap was seen. Checking the relay's node alone let such a gap be
 * abandoned and its row, committed a moment later, never become an event.
 *
 * So every node of DB_HOSTS is checked, each after a causal read (wsrep_sync_wait) that makes it
 * apply every row committed anywhere before, so that what it writes from then on takes ids above
 * every gap seen so far. A writer that can still fill such a gap had written before the check's own
 * transaction on its node and is listed there while open. Start times cannot rule writers out (a
 * lagging node's writer may have begun after the gap was seen), nor can the nodes' clocks be
 * compared, so checks are numbered and gaps settle by the writers' identity: the gaps seen before
 * the newest complete check none of whose writers is still open (this one, when it lists none).
 * Any earlier complete check will do, so a writer that outlives one check interval only delays
 * settling until it ends. The settled gaps must then be reread with a causal read too (a writer that
 * committed on another node just before the check may not be applied on the relay's node yet). When
 * fewer nodes answer than the cluster has, the check knows nothing (the caller falls back on age).
 */
export class ClusterWriters {
  private readonly logger = new Logger('WebhookRelay');
  private readonly pools: mysql.Pool[];
  /** Checks begun so far: a gap seen now is seen before every later check. */
  private begun = 0;
  private history: { check: number; writers: Map<string, Set<string>> }[] = [];
  private incompleteLogged = false;

  constructor(config: Pick<AppConfig, 'DB_HOSTS' | 'DB_HOST' | 'DB_PORT' | 'DB_USER' | 'DB_PASSWORD' | 'DB_NAME'>) {
    this.pools = databaseHosts(config).map(({ host, port }) =>
      mysql.createPool({
        host,
        port,
        user: config.DB_USER,
        password: config.DB_PASSWORD,
        database: config.DB_NAME,
        connectionLimit: 1,
        // A node that is down is left out of the answer; it must not hold up the relay's pass for long.
        connectTimeout: 1000,
      }),
    );
  }

  /** The number of the latest check begun: what a gap seen now carries. */
  get checksBegun(): number {
    return this.begun;
  }

  /**
   * Runs a check: gaps seen while fewer than the returned number of checks had begun can no longer be
   * filled (0: none); 'stale' when not every node of the cluster answered.
   */
  async settledBefore(): Promise<number | 'stale'> {
    const check = ++this.begun;
    const answers = await Promise.all(this.pools.map((pool) => checkNode(pool)));
    const open = new Map<string, Set<string>>();
    for (const a of answers) if (a !== null && a !== 'stale') open.set(a.node, a.writers);
    const sizes = answers.filter((a) => a !== null && a !== 'stale').map((a) => a.size);
    if (answers.includes('stale') || open.size === 0 || sizes.some((n) => n !== open.size)) {
      if (!this.incompleteLogged) {
        this.incompleteLogged = true;
        this.logger.warn(
          `Galera: ${open.size} node(s) of ${Math.max(0, ...sizes)} answered the open-writer check (list every node in DB_HOSTS): ` +
            'state-log gaps are waited for up to WEBHOOK_GAP_MAX_AGE_SECONDS',
        );
      }
      return 'stale';
    }
    this.incompleteLogged = false;
    this.history.push({ check, writers: open });
    const ended = (h: (typeof this.history)[number]) =>
      [...h.writers].every(([node, ids]) => ![...ids].some((id) => open.get(node)?.has(id)));
    const newest = this.history.findLastIndex(ended);
    // Older checks settle fewer gaps than the newest that qualifies: they are no longer needed.
    this.history = newest >= 0 ? this.history.slice(newest) : this.history.slice(-HISTORY);
    return newest >= 0 ? this.history[0].check : 0;
  }

  async close(): Promise<void> {
    await Promise.all(this.pools.map((p) => p.end().catch(() => undefined)));
  }
}

/**
 * One node's writers, after it applied everything committed before; null when it cannot be reached
 * (a node that is down is out of the cluster's size too), 'stale' when it did not answer in time,
 * the list was stale, or it is outside the primary component (whether its open transactions could
 * still commit once it rejoins is not known here, so they are not taken as ended). Every statement
 * has a deadline: a node that lost power leaves a pooled connection waiting for TCP to give up, minutes.
 */
async function checkNode(pool: mysql.Pool): Promise<NodeAnswer | 'stale' | null> {
  let conn: mysql.PoolConnection;
  try {
    conn = await pool.getConnection();
  } catch {
    return null;
  }
  const query = async (sql: string) => (await conn.query({ sql, timeout: NODE_TIMEOUT_MS }))[0];
  let failed = false;
  try {
    await query(`SET SESSION wsrep_sync_wait = 1`);
    // The causal read: a SELECT of a table, so the node first applies every writeset committed before it.
    const [status] = (await query(
      `SELECT (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_GCOMM_UUID') AS node,
              (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_CLUSTER_SIZE') AS size,
              (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_CLUSTER_STATUS') AS component,
              (SELECT log_id FROM webhook_relay_cursor WHERE name = 'relay') AS cursor_id`,
    )) as { node: string | null; size: string | null; component: string | null }[];
    if (status.component !== 'Primary' || !status.node) return 'stale';
    await query(`SET TRANSACTION ISOLATION LEVEL READ COMMITTED`);
    await query(`START TRANSACTION`);
    const writers = await writersBefore(query);
    return writers === 'stale' ? 'stale' : { node: status.node, size: Number(status.size), writers: new Set(writers.map((w) => w.id)) };
  } catch (err) {
    failed = true;
    // 1227: no PROCESS privilege, which the caller reports. Any other failure (a brute-force abort by
    // a replicated write, a deadline, the node going away) leaves this check without an answer.
    if (errnoOf(err) === 1227) throw err;
    return 'stale';
  } finally {
    // The rollback has a deadline too: a node frozen after the check would hold the relay's pass.
    if (
      failed ||
      !(await query(`ROLLBACK`).then(
        () => true,
        () => false,
      ))
    )
      conn.destroy();
    else conn.release();
  }
}
