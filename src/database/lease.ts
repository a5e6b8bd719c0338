import { setTimeout as sleep } from 'node:timers/promises';
import { Injectable, Logger } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { AppConfig } from '../config/app-config.js';
import { counter } from '../common/metrics.js';
import { PROCESS_ID } from './process-identity.js';
import { execute, runTransaction } from './transaction.service.js';

const lost = counter(
  'job_lease_lost_total',
  'Leases a running job lost (another holder took over, or renewals failed past the lease time)',
  ['name'],
);

/**
 * Cluster-wide "one at a time" for jobs (crons, migrations): a row per job in `job_lease`, claimed
 * with a conditional UPDATE (free, or its lease expired), renewed while the job runs, and free
 * for anyone once its holder stops renewing (crash, kill -9, lost network). It replaces MySQL's
 * GET_LOCK, which is local to one server: on Galera each node grants its own lock, so three
 * instances on three nodes all "held" it. A row is replicated like any other write, and a
 * conflicting claim on another node fails certification (1213) and is retried by the wrapper, where
 * the conditional UPDATE then finds the lease taken.
 *
 * The table is created by bootstrap (ensureLeaseTable) before any migration runs, since migrations
 * themselves run under a lease; like TypeORM's `migrations` table it is not part of the migrated
 * schema.
 *
 * Times are the database's clock (NOW(3)), so instances with skewed clocks agree on expiry; on
 * Galera each node's clock counts, so keep the nodes on NTP and LEASE_TTL_MS far above the skew.
 *
 * Using it from a job (one line, from any module: DatabaseModule is global):
 *     const result = await this.leases.runExclusive('hold-sweep', (signal) => this.sweep({ signal }));
 * `result` is null when another holder has the lease. `signal` aborts when the lease is lost; stop
 * at the next batch then (another instance may already be running the job).
 */
export const LEASE_TABLE_DDL = `CREATE TABLE IF NOT EXISTS job_lease (
  name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  holder VARCHAR(160) CHARACTER SET ascii COLLATE ascii_bin NULL,
  expires_at DATETIME(3) NOT NULL,
  acquired_at DATETIME(3) NULL,
  renewed_at DATETIME(3) NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`;

export async function ensureLeaseTable(ds: DataSource): Promise<void> {
  await ds.query(LEASE_TABLE_DDL);
}

/** Each acquisition adds a sequence number to the holder id, so two runs in one process exclude each other too. */
let acquisitions = 0;

export interface LeaseSettings {
  /** How long a lease lasts without renewal; renewed every third of it. */
  ttlMs: number;
  /** Retries of each lease statement on deadlock / certification failure (DB_TX_RETRIES). */
  retries: number;
}

export class LeaseLostError extends Error {}

/** A lease held by this process. */
export class Lease {
  private readonly controller = new AbortController();
  private readonly timer: NodeJS.Timeout;
  /** Local monotonic time by which a renewal must have succeeded, or the lease counts as lost. */
  private validUntil: number;
  private renewing: Promise<void> = Promise.resolve();

  constructor(
    private readonly ds: DataSource,
    readonly name: string,
    readonly holder: string,
    private readonly settings: LeaseSettings,
    startedAt: number,
  ) {
    this.validUntil = startedAt + settings.ttlMs;
    this.timer = setInterval(() => (this.renewing = this.renew()), Math.max(100, Math.floor(settings.ttlMs / 3)));
    this.timer.unref();
  }

  /** Aborts (reason: LeaseLostError) when the lease was lost; a job checks it between batches. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  private async renew(): Promise<void> {
    if (this.signal.aborted) return;
    const started = performance.now();
    try {
      const n = await runTransaction(this.ds, this.settings.retries, (em) =>
        execute(
          em,
          `UPDATE job_lease SET expires_at = NOW(3) + INTERVAL ? MICROSECOND, renewed_at = NOW(3) WHERE name = ? AND holder = ?`,
          [this.settings.ttlMs * 1000, this.name, this.holder],
        ),
      );
      if (n === 1) this.validUntil = started + this.settings.ttlMs;
      else this.lose('another holder took the lease over');
    } catch (err) {
      if (performance.now() >= this.validUntil) this.lose(`renewals failed past the lease time (${(err as Error).message})`);
    }
  }

  private lose(why: string): void {
    if (this.signal.aborted) return;
    clearInterval(this.timer);
    lost.inc({ name: this.name });
    new Logger('Lease').warn(`Lease ${this.name} lost: ${why}`);
    this.controller.abort(new LeaseLostError(`The lease ${this.name} was lost: ${why}`));
  }

  /**
   * Frees the lease for the next holder at once; with `keptUntil` (this process's clock), only then:
   * a cron tick's run, done, is not run again by an instance whose timer for the same tick fired a
   * moment later. The database counts the wait on its own clock, so neither the clocks' offset nor
   * the server's time zone moves it. Never throws: an unreleased lease expires by itself.
   */
  async release(keptUntil?: Date): Promise<void> {
    clearInterval(this.timer);
    await this.renewing;
    if (this.signal.aborted) return;
    this.controller.abort(new LeaseLostError(`The lease ${this.name} was released`));
    try {
      await runTransaction(this.ds, this.settings.retries, (em) =>
        keptUntil
          ? execute(em, `UPDATE job_lease SET holder = ?, expires_at = NOW(3) + INTERVAL ? MICROSECOND WHERE name = ? AND holder = ?`, [
              `done:${this.holder}`,
              Math.max(0, keptUntil.getTime() - Date.now()) * 1000,
              this.name,
              this.holder,
            ])
          : execute(em, `UPDATE job_lease SET holder = NULL, expires_at = NOW(3) WHERE name = ? AND holder = ?`, [this.name, this.holder]),
      );
    } catch {
      // The lease runs out within ttlMs.
    }
  }
}

/** Claims the lease `name` if it is free or expired; null when another holder has it. */
export async function tryAcquireLease(ds: DataSource, name: string, settings: LeaseSettings): Promise<Lease | null> {
  const holder = `${PROCESS_ID}#${++acquisitions}`;
  const started = performance.now();
  let claimed: number;
  try {
    claimed = await runTransaction(ds, settings.retries, async (em) => {
      await em.query(`INSERT INTO job_lease (name, expires_at) VALUES (?, NOW(3)) ON DUPLICATE KEY UPDATE name = name`, [name]);
      return execute(
        em,
        `UPDATE job_lease SET holder = ?, expires_at = NOW(3) + INTERVAL ? MICROSECOND, acquired_at = NOW(3), renewed_at = NOW(3)
         WHERE name = ? AND (holder IS NULL OR expires_at <= NOW(3))`,
        [holder, settings.ttlMs * 1000, name],
      );
    });
  } catch (err) {
    // The claim may have committed with its answer lost (the connection cut at COMMIT): the holder
    // id is this attempt's alone, so the row tells. Taken for failed, it blocked the job until it
    // expired, and a reconciliation trigger was answered 503, then 409 RECONCILIATION_RUNNING naming no run.
    // Kept for the time it has left (a COMMIT that hung may have used it up). On a cluster this read
    // may miss a claim another node has not applied yet: the lease then blocks until it expires, as before.
    const [row] = (await ds
      .query(`SELECT holder, TIMESTAMPDIFF(MICROSECOND, NOW(3), expires_at) AS left_us FROM job_lease WHERE name = ?`, [name])
      .catch(() => [])) as { holder: string | null; left_us: string }[];
    const leftMs = row ? Number(row.left_us) / 1000 : 0;
    if (row?.holder === holder && leftMs > 0) return new Lease(ds, name, holder, settings, performance.now() - (settings.ttlMs - leftMs));
    throw err;
  }
  return claimed === 1 ? new Lease(ds, name, holder, settings, started) : null;
}

/** Waits (polling) up to `waitMs` for the lease; throws when it stays taken. */
export async function acquireLease(
  ds: DataSource,
  name: string,
  settings: LeaseSettings,
  waitMs: number,
  onWait: (holder: string | null, expiresAt: Date) => void = () => undefined,
): Promise<Lease> {
  const deadline = Date.now() + waitMs;
  for (let waited = false; ; waited = true) {
    const lease = await tryAcquireLease(ds, name, settings);
    if (lease) return lease;
    if (!waited) {
      const [taken] = (await ds.query(`SELECT holder, expires_at FROM job_lease WHERE name = ?`, [name])) as {
        holder: string | null;
        expires_at: Date;
      }[];
      if (taken) onWait(taken.holder, taken.expires_at);
    }
    if (Date.now() >= deadline) throw new Error(`The lease ${name} stayed taken for ${waitMs} ms`);
    await sleep(Math.min(500, settings.ttlMs / 4));
  }
}

/** The app's way to take a lease (LEASE_TTL_MS, DB_TX_RETRIES, the app's pool). */
@Injectable()
export class LeaseService {
  constructor(
    private readonly ds: DataSource,
    private readonly config: AppConfig,
  ) {}

  private get settings(): LeaseSettings {
    return { ttlMs: this.config.LEASE_TTL_MS, retries: this.config.DB_TX_RETRIES };
  }

  tryAcquire(name: string): Promise<Lease | null> {
    return tryAcquireLease(this.ds, name, this.settings);
  }

  /** Runs `fn` while holding the lease `name` and releases it after; null (fn not run) when another holder has it. */
  /** `keep`: how long the lease stays taken after `fn` resolved with this result (Lease.release); not after a failure. */
  async runExclusive<T>(name: string, fn: (signal: AbortSignal) => Promise<T>, keep?: (result: T) => Date | undefined): Promise<T | null> {
    const lease = await this.tryAcquire(name);
    if (!lease) return null;
    let keptUntil: Date | undefined;
    try {
      const result = await fn(lease.signal);
      keptUntil = keep?.(result);
      return result;
    } finally {
      await lease.release(keptUntil);
    }
  }
}
