import { Logger } from '@nestjs/common';
import type { DataSource, EntityManager } from 'typeorm';
import { errnoOf } from '../common/db-errors.js';
import { counter, gauge } from '../common/metrics.js';
import type { AppConfig } from '../config/app-config.js';
import type { TransactionService } from '../database/transaction.service.js';
import { type LogEntry, logRowsAfter, logRowsInRanges } from '../ledger/state-log.js';
import { ClusterWriters, clusterSize, writersBefore } from './cluster-writers.js';
import { buildEvent } from './events.js';
import { enabledEndpoints, subscribedTypes } from './webhook.store.js';

const eventsCreated = counter(
  'webhook_events_created_total',
  'Deliveries created by the relay (one per event and subscribed endpoint)',
  [],
);
const openGaps = gauge(
  'webhook_relay_open_gaps',
  'State-log ids the relay has seen skipped and still waits for (their transaction may yet commit)',
);

const BATCH = 2000;
/** Open gaps reread by one statement. */
const GAPS_PER_READ = 500;
/** How often an idle relay rereads every open gap (one that reads new rows always does). */
const ALL_GAPS_EVERY_MS = 1000;
/**
 * information_schema.innodb_trx is a cache that InnoDB rebuilds only when it has not been read for
 * 100 ms: polled more often (by this relay on a busy log, or by any other reader on the server) it
 * keeps answering the same list, committed transactions included, indefinitely. The gap check reads
 * it at most this often, and trusts an answer only when it lists the check's own transaction.
 */
const GAP_PROBE_EVERY_MS = 250;

/**
 * Ids lo..hi (inclusive) missing from the log when a read at DB time `seenAt` (unix seconds) showed
 * a higher id, after `seenCheck` checks of a Galera cluster had begun.
 */
interface Gap {
  lo: bigint;
  hi: bigint;
  seenAt: number;
  seenCheck: number;
}

/** Which open gaps can no longer be filled. */
type Settled = (g: Gap) => boolean;
const NONE: Settled = () => false;

/**
 * Turns committed state-log rows into deliveries, exactly one per (endpoint, log row), and keeps a
 * durable cursor so that a restart rereads only what may not have been turned yet.
 *
 * Why the cursor is not simply "the highest id read": ids are taken from AUTO_INCREMENT when a row is
 * inserted, but transactions commit in any order, so a read can see row 12 committed while row 11
 * belongs to a transaction still open, which commits a moment later; and a rolled-back transaction
 * leaves its ids missing forever. A relay that read "id > cursor" and then moved the cursor past 12
 * would never see 11. So every missing id below the highest id read is an open gap: the rows above it
 * are turned into deliveries at once (a later row of the same coupon cannot commit before an earlier
 * one, since each change of a coupon holds its row lock until commit, so per-coupon order is safe),
 * but the durable cursor stays below the lowest open gap. A gap closes when its row shows up, or when
 * no transaction that could have written it is still open (see probeOpenWriters), and a reread
 * after that check sees its row if it committed. Without the PROCESS privilege innodb_trx cannot be
 * read and a gap closes after WEBHOOK_GAP_MAX_AGE_SECONDS, the longest a transaction writing the
 * log may stay open. Turning a row twice is harmless: (endpoint_id,
 * log_id) is unique and the insert is a no-op on a duplicate, so rereads after a crash, a re-read
 * gap, or two relays during a lease hand-over still give one delivery per endpoint and row.
 */
export class FanOut {
  private readonly logger = new Logger(FanOut.name);
  /** The highest id read in this process (null: start again from the durable cursor). */
  private scanned: bigint | null = null;
  private gaps: Gap[] = [];
  /** The cursor as this process last wrote (or read) it. */
  private durable: string | null = null;
  private trxUnreadableLogged = false;
  private probedAt = 0;
  private allGapsReadAt = 0;
  /** Set once the relay finds itself on a Galera cluster of more than one node. */
  private cluster: ClusterWriters | null = null;
  /** Whether the last check was the cluster's: its settled gaps are then reread with a causal read. */
  private clusterChecked = false;

  constructor(
    private readonly dataSource: DataSource,
    private readonly tx: TransactionService,
    private readonly config: AppConfig,
  ) {}

  /** Forget the in-memory position (a new leadership term starts from the durable cursor). */
  reset(): void {
    this.scanned = null;
    this.gaps = [];
    this.probedAt = 0;
    this.durable = null;
    openGaps.set(0);
  }

  /** The highest log id read so far in this leadership term, if any. */
  get position(): string | null {
    return this.scanned === null ? null : String(this.scanned);
  }

  /**
   * One pass: read new rows, reread open gaps, create their deliveries and move the cursor, the
   * last two in one transaction. Returns how many deliveries were created and whether more rows wait.
   */
  async pass(): Promise<{ created: number; more: boolean }> {
    const db = this.dataSource.manager;
    if (this.scanned === null) this.durable = await readCursor(db);
    const scanned = this.scanned ?? BigInt(this.durable as string);
    const open = this.scanned === null ? [] : this.gaps;
    const settled = open.length > 0 ? await this.settledGaps() : NONE;
    const rows = await logRowsAfter(db, String(scanned), BATCH);
    // A pass that read new rows rereads every open gap, after them: a row of a gap that committed
    // before one of them was written (an earlier change of its coupon) is found by this pass, so a
    // coupon's events are turned in log order. Rereading only the first 1,000 ids of the gaps
    // (before the new rows) let a gap of a rolled-back bulk batch, wider than that, stay open for
    // good: the gaps above it were never reread, their rows committed late never became events,
    // and the cursor stopped at it. An idle pass rereads the gaps the check settled (to close
    // them), and all of them once a second (a row committed late in one is turned within it):
    // every gap on every 200 ms poll cost a statement per 500 gaps, and on a Galera cluster,
    // whose auto-increment step leaves a gap beside every row, there may be many.
    const all = rows.length > 0 || Date.now() - this.allGapsReadAt >= ALL_GAPS_EVERY_MS;
    if (all) this.allGapsReadAt = Date.now();
    const reread = all ? open : open.filter(settled);
    const found = await this.reread(reread, this.clusterChecked && open.some(settled));
    // A gap closes when it was reread after the check that settled it (every settled gap was).
    const gaps = splitGaps(
      open,
      found.map((e) => BigInt(e.id)),
    ).filter((g) => !settled(g));
    let next = scanned;
    let seenAt: number | undefined;
    for (const r of rows) {
      const id = BigInt(r.id);
      if (id > next + 1n)
        gaps.push({ lo: next + 1n, hi: id - 1n, seenAt: (seenAt ??= await dbNow(db)), seenCheck: this.cluster?.checksBegun ?? 0 });
      next = id;
    }
    const entries = [...found, ...rows];

    const cursor = gaps.length > 0 ? String(gaps[0].lo - 1n) : String(next);
    const created =
      entries.length === 0 && cursor === this.durable
        ? 0
        : await this.tx.inTransaction(async (em) => {
            const n = await createDeliveries(em, entries);
            await em.query(
              `UPDATE webhook_relay_cursor SET log_id = ?, updated_at = UTC_TIMESTAMP(3) WHERE name = 'relay' AND log_id < ?`,
              [cursor, cursor],
            );
            return n;
          });
    // Only after the commit: a failed pass leaves the in-memory position where it was.
    this.scanned = next;
    this.gaps = gaps;
    this.durable = cursor;
    eventsCreated.inc(created);
    openGaps.set(gaps.reduce((n, g) => n + Number(g.hi - g.lo + 1n), 0));
    return { created, more: rows.length === BATCH };
  }

  /** The open-writer check of this server, or of every node of its Galera cluster (cluster-writers.ts). */
  private async probe(): Promise<Settled | 'stale'> {
    this.clusterChecked = (await clusterSize(this.dataSource.manager)) > 1;
    if (!this.clusterChecked) {
      const before = await probeOpenWriters(this.dataSource);
      return before === 'stale' ? 'stale' : (g) => g.seenAt < before;
    }
    this.cluster ??= new ClusterWriters(this.config);
    const check = await this.cluster.settledBefore();
    return check === 'stale' ? 'stale' : (g) => g.seenCheck < check;
  }

  /** Closes the connections of the cluster's check, if it made any. */
  async close(): Promise<void> {
    await this.cluster?.close();
    this.cluster = null;
  }

  /** The log rows in the gaps; with `causal`, after the relay's node applied every commit of the cluster (cluster-writers.ts). */
  private async reread(gaps: readonly Gap[], causal: boolean): Promise<LogEntry[]> {
    const read = async (db: Pick<EntityManager, 'query'>) => {
      const found: LogEntry[] = [];
      for (let i = 0; i < gaps.length; i += GAPS_PER_READ) found.push(...(await logRowsInRanges(db, gaps.slice(i, i + GAPS_PER_READ))));
      return found;
    };
    if (!causal || gaps.length === 0) return read(this.dataSource.manager);
    const qr = this.dataSource.createQueryRunner('master');
    try {
      await qr.query(`SET SESSION wsrep_sync_wait = 1`);
      return await read(qr);
    } finally {
      // The pool's connections read without waiting (a statement fails only on a broken connection, which the pool drops).
      await qr.query(`SET SESSION wsrep_sync_wait = DEFAULT`).catch(() => undefined);
      await qr.release();
    }
  }

  /** The gaps that can no longer be filled, as far as this pass knows. Read before the gaps are reread. */
  private async settledGaps(): Promise<Settled> {
    if (Date.now() - this.probedAt < GAP_PROBE_EVERY_MS) return NONE;
    this.probedAt = Date.now();
    let settled: Settled | 'stale';
    try {
      settled = await this.probe();
    } catch (err) {
      // 1227: no PROCESS privilege.
      if (errnoOf(err) !== 1227) throw err;
      if (!this.trxUnreadableLogged) {
        this.trxUnreadableLogged = true;
        this.logger.warn(
          `information_schema.innodb_trx is not readable (grant PROCESS): state-log gaps are waited for ${this.config.WEBHOOK_GAP_MAX_AGE_SECONDS} s`,
        );
      }
      settled = 'stale';
    }
    if (settled !== 'stale' && !this.clusterChecked) return settled;
    // Without a trustworthy list, and on a cluster whatever the writers (one may stay open for good),
    // a gap is waited for as long as a log-writing transaction may stay open.
    const oldest = (await dbNow(this.dataSource.manager)) - this.config.WEBHOOK_GAP_MAX_AGE_SECONDS + 1;
    const aged: Settled = (g) => g.seenAt < oldest;
    return settled === 'stale' ? aged : (g) => settled(g) || aged(g);
  }
}

/**
 * The check on one server, in a transaction of its own begun after every gap open now was seen. Its
 * write gives it an InnoDB transaction id, and ids grow in the order transactions first write: the
 * writer of a missing log id had written before the read that showed the gap, so its id is lower,
 * and it is listed while open (writersBefore). A gap can then only be filled by a listed writer, and
 * only if that one had begun by the time the gap was seen: gaps seen before the oldest of those
 * began are settled, all of them when there is none.
 */
async function probeOpenWriters(dataSource: DataSource): Promise<number | 'stale'> {
  const qr = dataSource.createQueryRunner('master');
  try {
    await qr.startTransaction('READ COMMITTED');
    const writers = await writersBefore((sql) => qr.query(sql));
    if (writers === 'stale') return 'stale';
    return writers.length === 0 ? Infinity : Math.min(...writers.map((w) => w.started));
  } finally {
    await qr.rollbackTransaction().catch(() => undefined);
    await qr.release();
  }
}

export async function readCursor(db: Pick<EntityManager, 'query'>): Promise<string> {
  const [r] = (await db.query(`SELECT log_id FROM webhook_relay_cursor WHERE name = 'relay'`)) as { log_id: string }[];
  return String(r?.log_id ?? 0);
}

async function dbNow(db: Pick<EntityManager, 'query'>): Promise<number> {
  const [r] = (await db.query(`SELECT UNIX_TIMESTAMP() AS now`)) as { now: string | number }[];
  return Math.floor(Number(r.now));
}

/** The parts of the gaps not covered by rows that showed up; both in id order, walked once together. */
function splitGaps(gaps: readonly Gap[], found: readonly bigint[]): Gap[] {
  const parts: Gap[] = [];
  let f = 0;
  for (const g of gaps) {
    while (f < found.length && found[f] < g.lo) f++;
    let lo = g.lo;
    for (; f < found.length && found[f] <= g.hi; f++) {
      if (found[f] > lo) parts.push({ ...g, lo, hi: found[f] - 1n });
      lo = found[f] + 1n;
    }
    if (lo <= g.hi) parts.push({ ...g, lo });
  }
  return parts;
}

/** One delivery per entry and enabled endpoint subscribed to its type; an existing (endpoint, log id) is left as it is. */
async function createDeliveries(em: EntityManager, entries: readonly LogEntry[]): Promise<number> {
  if (entries.length === 0) return 0;
  // Shared locks: an endpoint deleted meanwhile waits for this commit, then deletes these deliveries too.
  const endpoints = await enabledEndpoints(em, true);
  if (endpoints.length === 0) return 0;
  const now = new Date();
  const values: unknown[][] = [];
  for (const e of entries) {
    const event = buildEvent(e);
    if (event === null) continue;
    const payload = JSON.stringify(event);
    for (const ep of endpoints) {
      if (subscribedTypes(ep).includes(event.type)) values.push([ep.id, e.id, e.userCouponId, event.type, payload, e.at, now, now]);
    }
  }
  let created = 0;
  for (let i = 0; i < values.length; i += 500) {
    const chunk = values.slice(i, i + 500);
    const res = (await em.query(
      `INSERT INTO webhook_delivery (endpoint_id, log_id, user_coupon_id, event_type, payload, event_at, status, attempts, next_attempt_at, created_at)
       VALUES ${chunk.map(() => `(?, ?, ?, ?, ?, ?, 'PENDING', 0, ?, ?)`).join(', ')} ON DUPLICATE KEY UPDATE id = id`,
      chunk.flat(),
    )) as { affectedRows: number };
    // A no-op duplicate counts 0 affected rows, an insert 1.
    created += res.affectedRows;
  }
  return created;
}
