import { setTimeout as sleep } from 'node:timers/promises';
import { BeforeApplicationShutdown, Injectable, Logger } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { DataSource, EntityManager, LessThan, QueryRunner, Repository } from 'typeorm';
import { AppConfig } from '../config/app-config.js';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError, shuttingDown } from '../common/errors.js';
import { Stopping } from '../common/stopping.js';
import { counter, gauge, histogram } from '../common/metrics.js';
import { Page, toPage } from '../common/page.js';
import { pollUntil } from '../database/deadline-pool.js';
import { Lease, LeaseService } from '../database/lease.js';
import { inSnapshot, TransactionService } from '../database/transaction.service.js';
import { AuditService, ChunkResult, Finding, Uses } from './audit.service.js';
import { holdChunk, orderChunk, OrderNaming, orderRowAudit, orderRowChunk } from './hold-audit.js';
import { lockUserCoupon } from '../ledger/user-coupons.js';
import { DiscrepancyType } from './diagnosis.js';
import { ReconciliationRun, RunMode, RunTotals, RunView, toRunView } from './reconciliation-run.entity.js';

const runsTotal = counter('reconciliation_runs_total', 'Reconciliation runs finished, by outcome', ['status', 'mode']);
const inProgress = gauge('reconciliation_run_in_progress', 'Whether this instance is running a reconciliation now');
const progressChecked = gauge(
  'reconciliation_run_checked_rows',
  'Rows audited so far by the current (or last) run on this instance, by audit',
  ['audit'],
);
const foundTotal = counter('reconciliation_discrepancies_total', 'Discrepancies recorded as new', ['type']);
const runDuration = histogram(
  'reconciliation_run_duration_seconds',
  'Duration of finished reconciliation runs',
  ['status'],
  [0.1, 1, 5, 15, 60, 300, 900, 3600],
);

/** What a finding is about: a coupon's stock, a user coupon (its LOCKED status, a hold of it, or its record), an order, or a redemption. */
type Entity =
  | { kind: 'coupon'; id: string }
  | { kind: 'order' | 'order-row' | 'order-refunded'; id: string }
  | { kind: 'limit'; id: string }
  | { kind: 'refund' | 'refund-redemption'; id: string }
  | { kind: 'redemption' | 'discount'; id: string }
  | { kind: 'locked' | 'hold' | 'uc'; id: string; userCouponId: string };

function entityOf(f: Finding): Entity {
  switch (f.type) {
    case 'STOCK_MISMATCH':
      return { kind: 'coupon', id: f.couponId };
    case 'LOCKED_WITHOUT_HOLD':
      return { kind: 'locked', id: f.userCouponId, userCouponId: f.userCouponId };
    case 'HOLD_WITHOUT_LOCKED':
      return { kind: 'hold', id: f.details.holdId, userCouponId: f.userCouponId };
    case 'ORDER_DISCOUNT_EXCEEDED':
      return { kind: 'order', id: f.orderNo };
    case 'ORDER_ROW_MISSING':
      // Its own kind: an order under review for its discounts may lose its row too, repaired apart.
      return { kind: 'order-row', id: f.orderNo };
    case 'ORDER_NOT_REFUNDED':
      // Its own kind: an order under review for its discounts may say not refunded too, and a lost row put
      // back unrefunded is found while its ORDER_ROW_MISSING, now out of date, may still be open.
      return { kind: 'order-refunded', id: f.orderNo };
    case 'REFUND_REPLACEMENT_MISSING':
      return { kind: 'refund', id: f.params.refundId };
    case 'REFUND_REDEMPTION_MISSING':
      // Its own kind: one refund may have lost both its returned coupon and its redemption's id, each repaired apart.
      return { kind: 'refund-redemption', id: f.params.refundId };
    case 'USER_LIMIT_EXCEEDED':
      return { kind: 'limit', id: `${f.couponId}:${f.details.userId}` };
    case 'REDEMPTION_DISCOUNT_EXCEEDED':
      // Its own kind: a redemption's coupon row lost later (REDEMPTION_WITHOUT_USED) is another finding.
      return { kind: 'discount', id: f.redemptionId };
    default:
      return f.couponId === null
        ? { kind: 'redemption', id: f.redemptionId }
        : { kind: 'uc', id: f.userCouponId, userCouponId: f.userCouponId };
  }
}

/** The entity a finding is about, unique while its discrepancy is open (see Discrepancy.openKey). */
function openKeyOf(f: Finding): string {
  const e = entityOf(f);
  return `${e.kind}:${e.id}`;
}

const MAX_ID = 2n ** 64n - 1n;

/** The ids that USER_COUPON_CHUNK-sized chunks from `range.min` read to cover `range` (the last chunk reaches past its max). */
function chunkedSpan(range: { min: bigint; max: bigint } | null): { min: bigint; max: bigint } | null {
  if (range === null) return null;
  const size = BigInt(USER_COUPON_CHUNK);
  return { min: range.min, max: range.min + ((range.max - range.min) / size + 1n) * size - 1n };
}

/** The id ranges outside `range` (all ids when there is none). */
function beyond(range: { min: bigint; max: bigint } | null): [bigint, bigint][] {
  if (range === null) return [[0n, MAX_ID]];
  return (
    [
      [0n, range.min - 1n],
      [range.max + 1n, MAX_ID],
    ] as [bigint, bigint][]
  ).filter(([lo, hi]) => lo <= hi);
}

/**
 * `chunk` and, read in its snapshot, the orders that rows of `table` with ids in [lo, hi] name and that
 * lost their row, or (refunds) whose row says they are not refunded.
 */
async function withOrderRows(q: QueryRunner, table: OrderNaming, lo: bigint, hi: bigint, chunk: ChunkResult): Promise<ChunkResult> {
  return { ...chunk, findings: [...chunk.findings, ...(await orderRowChunk(q, table, lo, hi, new Date()))] };
}

/** Rolls back a finding whose entity no longer shows it (see record). */
const REPAIRED = new Error('The finding was repaired since its snapshot');

interface Started {
  runId: string;
  done: Promise<RunView>;
}

/** User coupon / redemption ids per chunk, and coupons per stock chunk (each counts its coupons' user coupons). */
export const USER_COUPON_CHUNK = 5000;
const COUPON_CHUNK = 200;
/** How far before the last complete run's start an incremental run looks, for clock skew between instances. */
const INCREMENTAL_SLACK_MS = 5 * 60_000;
/** The furthest a zone is behind UTC (Etc/GMT+12), for a zone whose offset the server cannot tell (no time zone tables). */
const FURTHEST_BEHIND_UTC_MS = 12 * 3600_000;

/** How far the zone (by default the server's, `@@global.time_zone`) is behind UTC now; 0 for one ahead of it. */
export async function zoneBehindUtcMs(q: Pick<DataSource, 'query'>, zone: string | null = null): Promise<number> {
  const [row]: { ahead: string | null }[] = await q.query(
    `SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), CONVERT_TZ(UTC_TIMESTAMP(), '+00:00', COALESCE(?, @@global.time_zone))) AS ahead`,
    [zone],
  );
  return row.ahead === null ? FURTHEST_BEHIND_UTC_MS : Math.max(0, -Number(row.ahead)) * 1000;
}
const PROGRESS_LOG_MS = 10_000;
/** How often the run row's counts are brought up to date while it runs (each write is a commit). */
const PROGRESS_SAVE_MS = 1_000;

export const RECONCILIATION_LEASE = 'reconcile';

/** How long a refused trigger waits for the running run's row, and how often it looks. */
const RUN_ROW_WAIT_MS = 2000;
const RUN_ROW_POLL_MS = 25;
/** Allowed between the time a run writes as its end and the release of its lease (a commit and a statement). */
const END_TO_RELEASE_MS = 1000;
/** How often a run retries writing its end while the database is away. */
const END_RETRY_MS = 250;

/**
 * Runs the audits. One run at a time across every instance (and every Galera node): the run holds
 * the `reconcile` lease for its whole length; if its process dies, the lease expires
 * (LEASE_TTL_MS) and the next start marks the orphaned RUNNING row FAILED. A run that loses its
 * lease stops at its next chunk, FAILED. Every write of a run goes through the retry wrapper, since
 * on Galera any of them can meet a certification failure (1213).
 */
@Injectable()
export class ReconciliationService implements BeforeApplicationShutdown {
  private readonly logger = new Logger('Reconciliation');
  /** Starts and runs under way on this instance; shutdown waits for all of them. */
  private readonly inFlight = new Set<Promise<unknown>>();
  /** Set at shutdown: runs stop at their next chunk (marked FAILED) and no new run starts. */
  private closing = false;

  constructor(
    private readonly dataSource: DataSource,
    private readonly tx: TransactionService,
    private readonly config: AppConfig,
    private readonly audits: AuditService,
    @InjectRepository(ReconciliationRun) private readonly runs: Repository<ReconciliationRun>,
    private readonly leases: LeaseService,
    private readonly stopping: Stopping,
  ) {}

  /**
   * Takes the lease and records a RUNNING run, then audits in the background. Resolves once the run
   * is recorded (its id is final); `done` resolves with the finished run and never rejects.
   */
  async start(mode: RunMode, triggeredBy: string): Promise<Started> {
    return (await this.startUnlessRan(mode, triggeredBy))!;
  }

  /** start(), but none when `ranSince` is given and a cron run started at or after it. */
  private startUnlessRan(mode: RunMode, triggeredBy: string, ranSince?: Date): Promise<Started | undefined> {
    // Draining too: a run started now would be cut at the close; another instance takes the trigger.
    if (this.closing || this.stopping.draining) throw shuttingDown();
    const started = this.open(mode, triggeredBy, ranSince);
    const tracked = started.then(
      (r) => r?.done,
      () => undefined,
    );
    this.inFlight.add(tracked);
    void tracked.finally(() => this.inFlight.delete(tracked));
    return started;
  }

  private async open(mode: RunMode, triggeredBy: string, ranSince?: Date): Promise<Started | undefined> {
    const triedAt = new Date();
    const lease = await this.leases.tryAcquire(RECONCILIATION_LEASE);
    if (!lease) throw await this.alreadyRunning(triedAt);
    let runId: string | undefined;
    try {
      runId = await this.tx.inTransaction(async (em) =>
        ranSince && (await this.cronRanSince(em, ranSince)) ? undefined : this.recordStart(em, mode, triggeredBy),
      );
    } catch (err) {
      await lease.release();
      throw err;
    }
    if (runId === undefined) {
      await lease.release();
      return undefined;
    }
    return { runId, done: this.execute(runId, lease, mode) };
  }

  /** Read under the lease, so no other instance's cron run can start in between. */
  private async cronRanSince(em: EntityManager, since: Date): Promise<boolean> {
    const rows: unknown[] = await em.query(`SELECT id FROM reconciliation_run WHERE triggered_by = 'cron' AND started_at >= ? LIMIT 1`, [
      since,
    ]);
    return rows.length > 0;
  }

  /**
   * The refusal of a second trigger, naming the run in progress. Its instance records the run just
   * after taking the lease, so a trigger that comes in between (two clicks) waits for the row rather
   * than answering without `runId`. A short run can also end before the refusal reads it: a run that
   * finished after the lease was tried is the one that held it. When no such row comes within
   * RUN_ROW_WAIT_MS, the holder was a run that wrote its end just before the try, and released the
   * lease just after: it takes that time before its last commit (2 of 35 triple clicks on runs of
   * 20 ms had no runId). Only a holder that never records a run (it died in between) leaves it out.
   */
  private async alreadyRunning(triedAt: Date): Promise<AppError> {
    const until = pollUntil(RUN_ROW_WAIT_MS);
    const refusal = (runId?: string) =>
      new AppError('RECONCILIATION_RUNNING', 'A reconciliation run is already in progress', runId ? { runId } : undefined);
    const latest = async (endedFrom: Date) =>
      (
        (await this.dataSource.query(
          `SELECT id FROM reconciliation_run WHERE status = 'RUNNING' OR finished_at >= ? ORDER BY id DESC LIMIT 1`,
          [endedFrom],
        )) as { id: string }[]
      )[0]?.id;
    for (;;) {
      const running = await latest(triedAt);
      if (running) return refusal(running);
      if (Date.now() >= until) return refusal(await latest(new Date(triedAt.getTime() - END_TO_RELEASE_MS)));
      await sleep(RUN_ROW_POLL_MS);
    }
  }

  /**
   * A run whose end could not be written (the database away for a moment as it ended) writes it
   * once the database answers again, and only then releases the lease: meanwhile a trigger is
   * refused naming this run, then the next one starts at once. Before, the run stayed RUNNING and
   * its lease held (its release failed too), refusing every trigger until the lease ran out. At
   * shutdown it tries once more (beforeApplicationShutdown waits for it, the pool still open); it
   * stops once the lease is lost (another holder may have marked the run FAILED) or after
   * LEASE_TTL_MS, and the next run then marks it FAILED.
   */
  private async recordEndLater(runId: string, recordEnd: () => Promise<unknown>, lease: Lease): Promise<void> {
    const until = Date.now() + this.config.LEASE_TTL_MS;
    let recorded = false;
    while (!recorded && !lease.signal.aborted && Date.now() < until) {
      const last = this.closing;
      if (!last) await sleep(END_RETRY_MS);
      recorded = await recordEnd().then(
        () => true,
        () => false,
      );
      if (last) break;
    }
    if (recorded) this.logger.log(`Reconciliation run ${runId} recorded its end`);
    else this.logger.warn(`Reconciliation run ${runId} could not record its end; the next run will mark it FAILED`);
    await lease.release();
  }

  /** Starts a run and waits for it to finish. */
  async runNow(mode: RunMode = 'FULL', triggeredBy = 'system'): Promise<RunView> {
    return (await this.start(mode, triggeredBy)).done;
  }

  /**
   * The cron's entry point, for the tick due at `due`: never throws; a run already going elsewhere is
   * not an error. Runs once per tick across the cluster: an instance whose timer fires after another
   * instance's run for the same tick has finished (a busy event loop) finds that run and skips.
   * Returns when the run is done or `signal` aborts (shutdown), whichever is first: at shutdown the
   * run itself stops at its next chunk and beforeApplicationShutdown waits for it.
   */
  async runScheduled(signal: AbortSignal, due: Date): Promise<void> {
    try {
      const started = await this.startUnlessRan('INCREMENTAL', 'cron', due);
      if (!started) {
        this.logger.log(`Scheduled reconciliation skipped: the run due at ${due.toISOString()} has been done`);
        return;
      }
      await Promise.race([started.done, new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }))]);
    } catch (err) {
      if (err instanceof AppError && err.code === 'RECONCILIATION_RUNNING')
        this.logger.log('Scheduled reconciliation skipped: another run is in progress');
      else this.logger.error(`Scheduled reconciliation could not start: ${(err as Error).message}`);
    }
  }

  async list(limit: number, cursor?: string): Promise<Page<RunView>> {
    const rows = await this.runs.find({ where: cursor ? { id: LessThan(cursor) } : {}, order: { id: 'DESC' }, take: limit + 1 });
    return toPage(rows, limit, toRunView);
  }

  async get(runId: string): Promise<RunView & { byType: Partial<Record<DiscrepancyType, number>> }> {
    const run = await this.runs.findOneBy({ id: runId });
    if (!run) throw new AppError('RUN_NOT_FOUND', `No reconciliation run ${runId}`, { runId });
    const counts: { type: DiscrepancyType; n: string }[] = await this.dataSource.query(
      `SELECT type, COUNT(*) AS n FROM discrepancy WHERE run_id = ? GROUP BY type`,
      [runId],
    );
    const byType = Object.fromEntries(counts.map((c) => [c.type, Number(c.n)]));
    // A running run's row is saved about once a second; its findings are its count, and the two
    // shown side by side (0 new discrepancies above five by type) contradicted each other.
    const discrepancies = run.status === 'RUNNING' ? counts.reduce((n, c) => n + Number(c.n), 0) : run.discrepancies;
    return { ...toRunView(run), discrepancies, byType };
  }

  /**
   * Lets a run in progress (or one a cron tick is just starting) stop at its next chunk, marked
   * FAILED, while the pool is still open.
   */
  async beforeApplicationShutdown(): Promise<void> {
    this.closing = true;
    await Promise.all(this.inFlight);
  }

  private async recordStart(em: EntityManager, mode: RunMode, triggeredBy: string): Promise<string> {
    const now = new Date();
    // We hold the lease, so any run still RUNNING lost its lease: its process died or it stopped renewing.
    const died = (await em.query(`UPDATE reconciliation_run SET status = 'FAILED', finished_at = ?, error = ? WHERE status = 'RUNNING'`, [
      now,
      'Died: its process ended or it lost its lease before it finished (found by the next run)',
    ])) as { affectedRows?: number };
    if (died.affectedRows) {
      this.logger.warn(`Marked ${died.affectedRows} dead reconciliation run(s) FAILED`);
      runsTotal.inc({ status: 'FAILED', mode: 'unknown' }, died.affectedRows);
    }
    const res = (await em.query(
      `INSERT INTO reconciliation_run (status, mode, triggered_by, started_at, checked, discrepancies) VALUES ('RUNNING', ?, ?, ?, 0, 0)`,
      [mode, triggeredBy.slice(0, 64), now],
    )) as { insertId: number | string };
    return String(res.insertId);
  }

  private async execute(runId: string, lease: Lease, requested: RunMode): Promise<RunView> {
    const q = this.dataSource.createQueryRunner();
    inProgress.set(1);
    progressChecked.reset();
    const started = Date.now();
    const totals = { checked: 0, found: 0 };
    const counted: RunTotals = { userCoupons: 0, redemptions: 0, discountCents: 0, refundedRedemptions: 0, refundedDiscountCents: 0 };
    let status: 'COMPLETED' | 'FAILED' = 'FAILED';
    let error: string | null = null;
    let mode = requested;
    try {
      const since = mode === 'INCREMENTAL' ? await this.lastCompleteStart(runId) : null;
      if (mode === 'INCREMENTAL' && !since) {
        // Nothing complete to be incremental from: this run checks everything.
        mode = 'FULL';
        await this.tx.inTransaction((em) => em.query(`UPDATE reconciliation_run SET mode = 'FULL' WHERE id = ?`, [runId]));
      }
      // A decision, either way, reopens its entity to the audit: an incremental run replays these too.
      const recheck = since ? await this.decidedSince(since) : [];
      this.logger.log(`Reconciliation run ${runId} started (${mode}${since ? `, log audit since ${since.toISOString()}` : ''})`);
      // The first chunk's progress is saved at once: a run of a second or less showed 0 rows checked until it ended.
      let [lastLog, lastSave] = [Date.now(), 0];
      const saveProgressIfDue = async () => {
        if (Date.now() - lastSave < PROGRESS_SAVE_MS) return;
        lastSave = Date.now();
        await this.tx.inTransaction((em) =>
          em.query(`UPDATE reconciliation_run SET checked = ?, discrepancies = ? WHERE id = ?`, [totals.checked, totals.found, runId]),
        );
      };
      const stopIfClosing = () => {
        if (this.closing) throw new Error('Interrupted: the instance shut down');
      };
      const step = async (audit: string, chunk: ChunkResult) => {
        stopIfClosing();
        if (lease.signal.aborted) throw lease.signal.reason as Error;
        totals.checked += chunk.checked;
        if (audit === 'user_coupon') counted.userCoupons += chunk.checked;
        if (chunk.uses) for (const [k, v] of Object.entries(chunk.uses)) counted[k as keyof Uses] += v;
        progressChecked.inc({ audit }, chunk.checked);
        await saveProgressIfDue();
        // Each finding is a transaction of its own: a chunk of a thousand took 15 s, past a stop's
        // time to close, and the run's row, written only between chunks, showed 66 discrepancies all that time.
        for (const f of chunk.findings) {
          stopIfClosing();
          if (await this.record(runId, f)) totals.found++;
          await saveProgressIfDue();
        }
        await saveProgressIfDue();
        if (Date.now() - lastLog >= PROGRESS_LOG_MS) {
          lastLog = Date.now();
          this.logger.log(
            `Reconciliation run ${runId}: ${audit} audit, ${totals.checked} rows checked, ${totals.found} discrepancies so far`,
          );
        }
      };

      for (let after = '0'; ;) {
        const chunk = await inSnapshot(q, () => this.audits.stockChunk(q, after, COUPON_CHUNK));
        await step('stock', chunk);
        if (chunk.lastCouponId === null) break;
        after = chunk.lastCouponId;
      }
      for (let after = '0'; ;) {
        const chunk = await inSnapshot(q, () => this.audits.userLimitChunk(q, after, COUPON_CHUNK));
        await step('user_limit', chunk);
        if (chunk.lastCouponId === null) break;
        after = chunk.lastCouponId;
      }
      const userCoupons = await this.audits.idRange(q, 'user_coupon');
      await this.byIdRange(q, userCoupons, async (cq, lo, hi) => {
        const chunk = await inSnapshot(cq, async () => {
          const audited = await this.audits.userCouponChunk(cq, lo, hi, since, recheck);
          return {
            checked: audited.checked,
            findings: [
              ...audited.findings,
              ...(await holdChunk(cq, lo, hi, new Date())),
              ...(await this.audits.redemptionFindings(cq, 'user_coupon_id', lo, hi)),
            ],
          };
        });
        await step('user_coupon', chunk);
      });
      // Holds naming user coupons past the ids the chunks above read (rows gone) are in no chunk above.
      const covered = chunkedSpan(userCoupons);
      for (const [lo, hi] of beyond(covered)) {
        await step('hold', await inSnapshot(q, async () => ({ checked: 0, findings: await holdChunk(q, lo, hi, new Date()) })));
      }
      // Redemptions likewise, read here by their own ids, 5,000 at a time, however many there are.
      await this.byIdRange(q, await this.audits.idRange(q, 'redemption'), async (cq, lo, hi) =>
        step(
          'redemption',
          await inSnapshot(cq, async () => {
            const chunk = await this.audits.redemptionChunk(cq, lo, hi);
            const findings = [
              ...(await this.audits.redemptionFindings(cq, 'id', lo, hi, covered)),
              ...(await orderChunk(cq, lo, hi, new Date())),
            ];
            return { ...chunk, findings };
          }),
        ),
      );
      await this.byIdRange(q, await this.audits.idRange(q, 'refund'), async (cq, lo, hi) =>
        step('refund', await inSnapshot(cq, async () => withOrderRows(cq, 'refund', lo, hi, await this.audits.refundChunk(cq, lo, hi)))),
      );
      // Holds are audited with their user coupons above; by their own ids here, only for the orders they name.
      await this.byIdRange(q, await this.audits.idRange(q, 'redemption_hold'), async (cq, lo, hi) =>
        step('hold', await inSnapshot(cq, () => withOrderRows(cq, 'redemption_hold', lo, hi, { checked: 0, findings: [] }))),
      );
      status = 'COMPLETED';
    } catch (err) {
      error = (err as Error).message.slice(0, 1000);
      this.logger.error(`Reconciliation run ${runId} failed: ${error}`);
    }
    // Totals only for a run that read everything: a partial one would read as a smaller ledger. A
    // figure past 2^53 (an amount edited by hand near the column's limit) is no figure: written, it
    // failed the run's end every time, or would have been rounded.
    const sums = status === 'COMPLETED' && Object.values(counted).every(Number.isSafeInteger) ? counted : null;
    const recordEnd = () =>
      this.tx.inTransaction((em) =>
        em.query(
          `UPDATE reconciliation_run SET status = ?, finished_at = ?, checked = ?, discrepancies = ?, error = ?,
             user_coupons = ?, redemptions = ?, discount_cents = ?, refunded_redemptions = ?, refunded_discount_cents = ? WHERE id = ?`,
          [
            status,
            new Date(),
            totals.checked,
            totals.found,
            error,
            sums?.userCoupons ?? null,
            sums?.redemptions ?? null,
            sums?.discountCents ?? null,
            sums?.refundedRedemptions ?? null,
            sums?.refundedDiscountCents ?? null,
            runId,
          ],
        ),
      );
    let recorded = true;
    try {
      await recordEnd();
    } catch (err) {
      recorded = false;
      this.logger.error(`Reconciliation run ${runId} could not record its end (${(err as Error).message}); trying again`);
    } finally {
      await this.releaseConnection(q);
      inProgress.set(0);
    }
    if (recorded) await lease.release();
    else {
      const later = this.recordEndLater(runId, recordEnd, lease);
      this.inFlight.add(later);
      void later.finally(() => this.inFlight.delete(later));
    }
    const seconds = (Date.now() - started) / 1000;
    runsTotal.inc({ status, mode });
    runDuration.observe({ status }, seconds);
    this.logger.log(
      `Reconciliation run ${runId} ${status} in ${seconds.toFixed(1)} s: ${totals.checked} rows checked, ${totals.found} new discrepancies`,
    );
    const finished = await this.runs.findOneBy({ id: runId }).catch(() => null);
    return finished
      ? toRunView(finished)
      : {
          id: runId,
          status,
          mode,
          triggeredBy: '',
          startedAt: new Date(started).toISOString(),
          finishedAt: null,
          checked: totals.checked,
          discrepancies: totals.found,
          error,
          totals: sums,
        };
  }

  /**
   * `audit` over ids min..max in chunks of USER_COUPON_CHUNK, RECONCILE_CONCURRENCY chunks at once,
   * each worker on a connection of its own (`q` is the first): a chunk is one snapshot of its own
   * either way, so reading several at once changes no finding, and the database's other cores and
   * disk reads overlap. The first failure stops every worker at its next chunk and is rethrown.
   */
  private async byIdRange(
    q: QueryRunner,
    range: { min: bigint; max: bigint } | null,
    audit: (q: QueryRunner, lo: bigint, hi: bigint) => Promise<void>,
  ): Promise<void> {
    if (range === null) return;
    let next = range.min;
    let failed = false;
    const worker = async (wq: QueryRunner) => {
      while (!failed && next <= range.max) {
        const lo = next;
        next += BigInt(USER_COUPON_CHUNK);
        try {
          await audit(wq, lo, lo + BigInt(USER_COUPON_CHUNK) - 1n);
        } catch (err) {
          failed = true;
          throw err;
        }
      }
    };
    const chunks = Number((range.max - range.min) / BigInt(USER_COUPON_CHUNK)) + 1;
    const extra = Array.from({ length: Math.min(this.config.RECONCILE_CONCURRENCY, chunks) - 1 }, () =>
      this.dataSource.createQueryRunner(),
    );
    const outcomes = await Promise.allSettled([q, ...extra].map(worker));
    await Promise.all(extra.map((wq) => this.releaseConnection(wq)));
    const failure = outcomes.find((o) => o.status === 'rejected');
    if (failure) throw failure.reason;
  }

  /** The user coupons of discrepancies decided since `since` (a handful a night). */
  private async decidedSince(since: Date): Promise<string[]> {
    const rows: { id: string }[] = await this.dataSource.query(
      `SELECT DISTINCT d.user_coupon_id AS id FROM compensation c JOIN discrepancy d ON d.id = c.discrepancy_id
       WHERE c.decided_at >= ? AND d.user_coupon_id IS NOT NULL`,
      [since],
    );
    return rows.map((r) => String(r.id));
  }

  private async lastCompleteStart(currentRunId: string): Promise<Date | null> {
    const [row]: { started_at: Date }[] = await this.dataSource.query(
      `SELECT started_at FROM reconciliation_run WHERE status = 'COMPLETED' AND id < ? ORDER BY id DESC LIMIT 1`,
      [currentRunId],
    );
    if (!row) return null;
    // The service writes user_coupon.updated_at in UTC; a hand edit stamps it (ON UPDATE) in its
    // session's zone, by default the server's: west of UTC, earlier than the edit.
    return new Date(row.started_at.getTime() - INCREMENTAL_SLACK_MS - (await zoneBehindUtcMs(this.dataSource)));
  }

  /**
   * Writes a finding and its PENDING compensation; false when the same entity already has an open
   * discrepancy, or no longer shows it. A finding is read in its chunk's snapshot; an approval that
   * committed since closed the open discrepancy and repaired what the finding shows, which would
   * then be proposed again. So the entity is audited once more after the insert, which waits for an
   * approval still closing that discrepancy, and (a user coupon) after a shared lock on its row,
   * which waits for an approval repairing it under another key: either way the audit sees the commit.
   */
  private async record(runId: string, f: Finding): Promise<boolean> {
    const openKey = openKeyOf(f);
    try {
      await this.tx.inTransaction(async (em) => {
        const now = new Date();
        const res = (await em.query(
          `INSERT INTO discrepancy (run_id, type, coupon_id, user_coupon_id, redemption_id, details, open_key, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
          [
            runId,
            f.type,
            f.couponId,
            'userCouponId' in f ? f.userCouponId : null,
            'redemptionId' in f ? f.redemptionId : null,
            JSON.stringify(f.details),
            openKey,
            now,
          ],
        )) as { insertId: number | string };
        await em.query(`INSERT INTO compensation (discrepancy_id, action, params, status, created_at) VALUES (?, ?, ?, 'PENDING', ?)`, [
          String(res.insertId),
          f.action,
          JSON.stringify(f.params),
          now,
        ]);
        if (!(await this.stillFound(em, f))) throw REPAIRED;
      });
    } catch (err) {
      if (err === REPAIRED || isDuplicateKey(err)) return false;
      throw err;
    }
    foundTotal.inc({ type: f.type });
    this.logger.warn(`Reconciliation run ${runId}: ${f.type} ${openKey}, proposed ${f.action}`);
    return true;
  }

  /** Whether the entity's audit, read now, still gives the finding: its type, about the same entity. */
  private async stillFound(em: EntityManager, f: Finding): Promise<boolean> {
    const key = openKeyOf(f);
    const again = await this.auditAgain(em, entityOf(f));
    return again === null || again.some((g) => g.type === f.type && openKeyOf(g) === key);
  }

  /** The findings of one entity's audit; null for an order's discounts or a user's limit, whose review changes no data when approved. */
  private async auditAgain(em: EntityManager, e: Entity): Promise<Finding[] | null> {
    switch (e.kind) {
      case 'order':
      case 'limit':
        return null;
      case 'order-row':
      case 'order-refunded':
        return orderRowAudit(em, e.id, new Date());
      case 'coupon':
        return (await this.audits.stockChunk(em, String(BigInt(e.id) - 1n), 1)).findings;
      case 'redemption':
      case 'discount':
        return this.audits.redemptionFindings(em, 'id', BigInt(e.id), BigInt(e.id));
      case 'refund':
      case 'refund-redemption':
        return (await this.audits.refundChunk(em, BigInt(e.id), BigInt(e.id))).findings;
      default: {
        // Every approval locks the user coupon first: this waits for one repairing the coupon under another key, and sees its commit.
        await lockUserCoupon(em, e.userCouponId, 'shared');
        const id = BigInt(e.userCouponId);
        return [...(await this.audits.userCouponChunk(em, id, id, null)).findings, ...(await holdChunk(em, id, id, new Date()))];
      }
    }
  }

  /** Never throws: a run's background promise must not reject. */
  private async releaseConnection(q: QueryRunner): Promise<void> {
    try {
      await q.release();
    } catch (err) {
      this.logger.warn(`Could not return the reconciliation connection to the pool: ${(err as Error).message}`);
    }
  }
}
