import { setMaxListeners } from 'node:events';
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { type BeforeApplicationShutdown, Injectable } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError, shuttingDown } from '../common/errors.js';
import { Stopping } from '../common/stopping.js';
import { LONE_SURROGATE, USER_ID_PATTERN, validationFailed } from '../common/validation.js';
import { toPage } from '../common/page.js';
import { AppConfig } from '../config/app-config.js';
import { CouponService } from '../coupon/coupon.service.js';
import { pollUntil, runWithDeadline } from '../database/deadline-pool.js';
import { TransactionService } from '../database/transaction.service.js';
import { validityEnded } from '../ledger/issue.service.js';
import {
  discardUpload,
  findJob,
  findJobByKey,
  insertJob,
  Job,
  listJobs,
  listSkips,
  queueUpload,
  unprocessedLines,
  setJobStatus,
  appendLines,
  JOB_STATUSES,
  STALE_UPLOAD_MS,
  touchUpload,
  UPLOAD_HEARTBEAT_MS,
} from './issuance.store.js';
import type { SkipReason } from './issuance.store.js';
import { IssuanceRunner } from './issuance-runner.js';
import { USER_ID_CSV_HEADER, skippedCsvLine } from './line-csvs.js';

/** Lines written to the database per statement while a list streams in. */
const UPLOAD_CHUNK = 2000;
/** Skipped lines read per statement while their CSV streams out. */
const CSV_PAGE = 2000;

/**
 * How long a repeat of a key waits for the first request's list to be stored before it answers 409
 * IDEMPOTENCY_IN_PROGRESS: a JSON list of 10,000 takes well under a second, a CSV of a million
 * lines minutes (that one is answered 409, retry later).
 */
const UPLOAD_WAIT_MS = 3000;
const UPLOAD_POLL_MS = 50;
/** How often the discard of a broken upload is tried again while the database does not take it. */
const DISCARD_RETRY_MS = 1000;

/** The upload was still for STALE_UPLOAD_MS (its writes could not get through) and another request or the runner discarded it. */
const uploadLost = () =>
  new AppError('SERVICE_UNAVAILABLE', 'The upload stalled and was discarded; send it again with the same Idempotency-Key');

const inProgress = (jobId?: string) =>
  new AppError('IDEMPOTENCY_IN_PROGRESS', 'The upload with this key is still in progress; retry shortly', jobId ? { jobId } : undefined);

/**
 * The digest store() keeps of a list: its lines' text in order, each ended by a line break (a JSON
 * list and a CSV of the same ids agree). A JSON id may hold a line break itself, or a lone surrogate
 * (hashed as text it is U+FFFD); such a text, and one starting with NUL, goes in as NUL and its
 * JSON string instead, so ["a\nb"] is not ["a", "b"], nor ["\ud800"] ["\ufffd"]. Every other line
 * hashes as it always has: a job stored before keeps its digest.
 */
const listHash = () => {
  const hash = createHash('sha256');
  const line = (text: string) =>
    text.includes('\n') || text.startsWith('\0') || LONE_SURROGATE.test(text) ? `\0${JSON.stringify(text)}` : text;
  return { add: (text: string) => hash.update(`${line(text)}\n`), hex: () => hash.digest('hex') };
};

async function listDigest(lines: AsyncIterable<{ text: string }>): Promise<string> {
  const digest = listHash();
  for await (const { text } of lines) digest.add(text);
  return digest.hex();
}

export interface JobRequest {
  couponId: string;
  key: string;
  reason: string;
  fromStock: boolean;
  createdBy: string;
}

export function toJobView(j: Job) {
  const skipped = Object.values(j.skippedByReason).reduce((a, b) => a + b, 0);
  return {
    id: j.id,
    couponId: j.couponId,
    status: j.status as (typeof JOB_STATUSES)[number],
    reason: j.reason,
    fromStock: j.fromStock,
    total: j.total,
    issued: j.issued,
    skipped,
    skippedByReason: j.skippedByReason,
    createdAt: j.createdAt.toISOString(),
    startedAt: j.startedAt?.toISOString() ?? null,
    finishedAt: j.finishedAt?.toISOString() ?? null,
  };
}
export type JobView = ReturnType<typeof toJobView>;

const visible = (j: Job) => j.status !== 'UPLOADING' && j.status !== 'DISCARDED';
const jobNotFound = (jobId: string) => new AppError('ISSUANCE_JOB_NOT_FOUND', `Issuance job ${jobId} does not exist`, { jobId });

/**
 * At most 64 code points of a line that is not a user id, to show it in the skipped list. A lone
 * surrogate (a JSON list's "\ud800") as its escape: the column cannot hold it, and it showed as U+FFFD.
 */
const shown = (text: string) =>
  Array.from(text.replace(/\p{Cs}/gu, (half) => `\\u${half.charCodeAt(0).toString(16)}`))
    .slice(0, 64)
    .join('');

/**
 * Bulk issuance jobs: the list streams into the database in chunks as it arrives (a million ids are
 * never in memory at once), the job becomes QUEUED only when the whole list is stored, and the
 * runner issues it. The Idempotency-Key is unique per job in the database.
 */
@Injectable()
export class IssuanceService implements BeforeApplicationShutdown {
  private readonly closing = new AbortController();

  constructor(
    private readonly ds: DataSource,
    private readonly tx: TransactionService,
    private readonly coupons: CouponService,
    private readonly runner: IssuanceRunner,
    private readonly config: AppConfig,
    private readonly instance: Stopping,
  ) {
    // Every CSV upload in progress listens to it: more than ten at once is no leak.
    setMaxListeners(0, this.closing.signal);
  }

  /** 202 for a new job, or the job this key made before (`replayed`). */
  async create(req: JobRequest, lines: AsyncIterable<{ lineNo: number; text: string }>): Promise<{ jobId: string; replayed: boolean }> {
    const earlier = await findJobByKey(this.ds.manager, req.key);
    // null: the earlier request's upload failed and was discarded, so the key is free again.
    const replayed = earlier && (await this.replay(earlier, req, lines));
    if (replayed) return replayed;
    const ended = validityEnded(await this.coupons.template(req.couponId), new Date());
    if (ended) throw ended;
    // Stopping: a job made now would only be discarded (and a CSV refused) as its upload starts;
    // draining, its upload of minutes would be cut when the listener closes. Another instance takes it.
    if (this.closing.signal.aborted || this.instance.draining) throw shuttingDown();
    let jobId: string;
    try {
      jobId = await this.tx.inTransaction((em) => insertJob(em, req, new Date()));
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      // A request with this key made its job meanwhile: answer that one (or, if its upload fails while
      // this one waits, let the client retry).
      const winner = await findJobByKey(this.ds.manager, req.key);
      const answer = winner && (await this.replay(winner, req, lines));
      if (answer) return answer;
      throw inProgress(winner?.id);
    }
    // A slow client may send less than a chunk between heartbeats; without them its upload would look abandoned.
    const heartbeat = setInterval(
      () => void this.tx.inTransaction((em) => touchUpload(em, jobId, new Date())).catch(() => undefined),
      UPLOAD_HEARTBEAT_MS,
    );
    try {
      // As a JSON list must hold one id at least, so must a file (blank lines and a header are no ids).
      const { count, digest } = await this.store(jobId, lines);
      if (count === 0) throw validationFailed({ body: ['holds no user id'] }, 'The list holds no user id');
      if (!(await this.tx.inTransaction((em) => queueUpload(em, jobId, digest, new Date())))) throw uploadLost();
    } catch (err) {
      await this.discard(jobId);
      throw err;
    } finally {
      clearInterval(heartbeat);
    }
    this.runner.wake();
    return { jobId, replayed: false };
  }

  /**
   * A refused or broken upload is gone for clients and its key may be used again. When even this
   * write fails (the upload broke because the database is unreachable), it is tried again every
   * second in the background: a client retrying the key once the database is back gets its job,
   * not 409 IDEMPOTENCY_IN_PROGRESS until the upload has been still for STALE_UPLOAD_MS.
   */
  private async discard(jobId: string): Promise<void> {
    const attempt = () =>
      this.tx
        .inTransaction((em) => discardUpload(em, jobId, new Date()))
        .then(
          () => true,
          () => false,
        );
    if (await attempt()) return;
    // With a job's limits: the request is answered (503) long before the database is back. Stops at
    // shutdown; the runner discards what is left once it has been still for STALE_UPLOAD_MS.
    const { signal } = this.closing;
    void runWithDeadline({ at: 0, answered: true }, async () => {
      for (const giveUpAt = Date.now() + STALE_UPLOAD_MS; Date.now() < giveUpAt && !signal.aborted;) {
        await sleep(DISCARD_RETRY_MS, undefined, { ref: false, signal }).catch(() => undefined);
        if (!signal.aborted && (await attempt())) return;
      }
    });
  }

  /**
   * Aborted when the instance starts stopping, before its HTTP server waits for the requests in
   * flight: a CSV upload then stops reading (userIdLines), its job is discarded and it is answered
   * 503, so its key is free for the retry elsewhere. Left to finish, an upload held the stop for
   * SHUTDOWN_TIMEOUT_MS (an upload's deadline is BULK_UPLOAD_TIMEOUT_MS, ten minutes), then the
   * process exited 1 and the uploader saw a reset.
   */
  get stopping(): AbortSignal {
    return this.closing.signal;
  }

  beforeApplicationShutdown(): void {
    this.closing.abort();
  }

  /**
   * The job this key made, once its list is stored: a repeat sent while the first request's list is
   * still being stored (two clicks, a client retrying at once) waits for it, so it gets the same
   * jobId as API.md says, not 409. Null when that upload failed meanwhile, or has been still for
   * STALE_UPLOAD_MS (the instance receiving it died): its key is free again.
   */
  private async replay(
    job: Job,
    req: JobRequest,
    lines: AsyncIterable<{ lineNo: number; text: string }>,
  ): Promise<{ jobId: string; replayed: true } | null> {
    const until = pollUntil(UPLOAD_WAIT_MS);
    for (let current: Job | null = job; current; current = await findJobByKey(this.ds.manager, req.key)) {
      if (current.couponId !== req.couponId) {
        throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This Idempotency-Key was already used for a job of another coupon', {
          jobId: current.id,
        });
      }
      // As a reissue's key: the same key asking for something else is a client's mistake, not a repeat.
      if (current.reason !== req.reason || current.fromStock !== req.fromStock) {
        throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This Idempotency-Key was already used for a job with another reason or fromStock', {
          jobId: current.id,
        });
      }
      if (current.status !== 'UPLOADING') {
        // Read only here, where the answer is decided: a key found free again stores these lines as its own job.
        if (current.listDigest !== null && (await listDigest(lines)) !== current.listDigest) {
          throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This Idempotency-Key was already used for a job with another list', {
            jobId: current.id,
          });
        }
        return { jobId: current.id, replayed: true };
      }
      const stale = new Date(Date.now() - STALE_UPLOAD_MS);
      if (current.updatedAt < stale && (await this.tx.inTransaction((em) => discardUpload(em, current.id, new Date(), stale)))) continue;
      if (Date.now() + UPLOAD_POLL_MS >= until) throw inProgress(current.id);
      await sleep(UPLOAD_POLL_MS);
    }
    return null;
  }

  /** Stores the list as it arrives; returns how many lines it held, and their digest. */
  private async store(jobId: string, lines: AsyncIterable<{ lineNo: number; text: string }>): Promise<{ count: number; digest: string }> {
    let count = 0;
    const digest = listHash();
    let valid: { lineNo: number; userId: string }[] = [];
    let invalid: { lineNo: number; userId: string }[] = [];
    const flush = async () => {
      const [v, i] = [valid, invalid];
      [valid, invalid] = [[], []];
      if (!(await this.tx.inTransaction((em) => appendLines(em, jobId, v, i, new Date())))) throw uploadLost();
    };
    for await (const { lineNo, text } of lines) {
      count++;
      digest.add(text);
      if (USER_ID_PATTERN.test(text)) valid.push({ lineNo, userId: text });
      else invalid.push({ lineNo, userId: shown(text) });
      if (valid.length + invalid.length >= UPLOAD_CHUNK) await flush();
    }
    await flush();
    return { count, digest: digest.hex() };
  }

  async get(jobId: string): Promise<JobView> {
    const job = await findJob(this.ds.manager, jobId);
    if (!job || !visible(job)) throw jobNotFound(jobId);
    return toJobView(job);
  }

  async list(couponId: string | undefined, cursor: string | undefined, limit: number) {
    return toPage(await listJobs(this.ds.manager, couponId, cursor, limit + 1), limit, toJobView);
  }

  async skipped(jobId: string, reason: SkipReason | undefined, cursor: number, limit: number) {
    await this.get(jobId);
    const rows = await listSkips(this.ds.manager, jobId, reason, cursor, limit + 1);
    return toPage(
      rows.map((r) => ({ ...r, id: String(r.line) })),
      limit,
      ({ line, userId, reason }) => ({ line, userId, reason }),
    );
  }

  /** All of the job's skipped lines (of `reason` when given) as a CSV a new job takes as its list. */
  skippedCsv(jobId: string, reason: SkipReason | undefined): Promise<Readable> {
    return this.csv(
      jobId,
      (after) => listSkips(this.ds.manager, jobId, reason, after, CSV_PAGE),
      (r) => skippedCsvLine(r.userId, r.reason),
    );
  }

  /**
   * The users of the lines the job has not reached, as a CSV a new job takes as its list: what a
   * cancelled or failed job left undone. Repeats of an earlier line are left out (the job would
   * skip them as DUPLICATE); a completed job's file is its header alone.
   */
  unprocessedCsv(jobId: string): Promise<Readable> {
    return this.csv(
      jobId,
      (after) => unprocessedLines(this.ds.manager, jobId, after, CSV_PAGE),
      (r) => `${r.userId}\r\n`,
    );
  }

  /**
   * A CSV of the job's rows that `read` pages through in line order, read a page at a time as the
   * client takes them: a million lines are never in memory. Unknown jobs are refused before the
   * answer starts; a job still running shows its rows as of the moment each page is read.
   */
  private async csv<R extends { line: number }>(
    jobId: string,
    read: (afterLine: number) => Promise<R[]>,
    lineOf: (row: R) => string,
  ): Promise<Readable> {
    // The file's own deadline is an upload's; each wait for the database is not. Until the file starts,
    // a request's (an outage is a 503, as elsewhere); after, the connection's idle limit
    // (2 x REQUEST_TIMEOUT_MS): a page stalled longer has lost its client, and must not hold a
    // connection of the pool for minutes.
    const within = <T>(ms: number, fn: () => Promise<T>) => runWithDeadline({ at: Date.now() + ms, answered: false }, fn);
    const first = await within(this.config.REQUEST_TIMEOUT_MS, async () => {
      await this.get(jobId);
      return read(0);
    });
    const idle = 2 * this.config.REQUEST_TIMEOUT_MS;
    async function* pages() {
      yield USER_ID_CSV_HEADER;
      for (let rows = first; ; rows = await within(idle, () => read(rows[rows.length - 1].line))) {
        if (rows.length > 0) yield rows.map(lineOf).join('');
        if (rows.length < CSV_PAGE) return;
      }
    }
    // Bytes, not objects: an object stream would read 16 pages ahead of a slow client.
    return Readable.from(pages(), { objectMode: false });
  }

  /** QUEUED or RUNNING -> CANCELLED; the runner's batch in flight (it holds the job row) commits first. */
  async cancel(jobId: string): Promise<JobView> {
    return this.tx.inTransaction(async (em) => {
      const job = await findJob(em, jobId, true);
      if (!job || !visible(job)) throw jobNotFound(jobId);
      if (job.status === 'COMPLETED' || job.status === 'FAILED') {
        throw new AppError('ISSUANCE_JOB_FINISHED', `Issuance job ${jobId} has already finished (${job.status})`, { status: job.status });
      }
      if (job.status !== 'CANCELLED') await setJobStatus(em, jobId, ['QUEUED', 'RUNNING'], 'CANCELLED', new Date());
      return toJobView((await findJob(em, jobId)) as Job);
    });
  }
}
