import type { EntityManager } from 'typeorm';
import { execute } from '../database/transaction.service.js';

/** Every statement on the bulk issuance tables (issuance_job, issuance_job_line, issuance_job_skip). */

type Queryable = Pick<EntityManager, 'query'>;

export const JOB_STATUSES = ['QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED'] as const;
/**
 * UPLOADING: the list is still streaming in, no client has been answered for it yet. DISCARDED: its
 * upload was refused or broke off; the runner deletes it (its key is free at once).
 */
export type JobStatus = (typeof JOB_STATUSES)[number] | 'UPLOADING' | 'DISCARDED';
export const SKIP_REASONS = ['USER_LIMIT_REACHED', 'SOLD_OUT', 'INVALID_USER_ID', 'DUPLICATE', 'COUPON_EXPIRED'] as const;
export type SkipReason = (typeof SKIP_REASONS)[number];

const SKIP_COLUMN: Record<SkipReason, string> = {
  USER_LIMIT_REACHED: 'skipped_user_limit',
  SOLD_OUT: 'skipped_sold_out',
  INVALID_USER_ID: 'skipped_invalid',
  DUPLICATE: 'skipped_duplicate',
  COUPON_EXPIRED: 'skipped_expired',
};

export interface Job {
  id: string;
  couponId: string;
  idempotencyKey: string;
  reason: string;
  fromStock: boolean;
  /** sha256 of the list's lines as sent, once stored; null for a job stored before the digest was kept. */
  listDigest: string | null;
  status: JobStatus;
  total: number;
  nextLine: number;
  issued: number;
  skippedByReason: Record<SkipReason, number>;
  createdBy: string;
  createdAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  updatedAt: Date;
}

function toJob(r: Record<string, unknown>): Job {
  return {
    id: String(r.id),
    couponId: String(r.coupon_id),
    idempotencyKey: r.idempotency_key as string,
    reason: r.reason as string,
    fromStock: Boolean(r.from_stock),
    listDigest: (r.list_digest as string | null) ?? null,
    status: r.status as JobStatus,
    total: Number(r.total),
    nextLine: Number(r.next_line),
    issued: Number(r.issued),
    skippedByReason: Object.fromEntries(SKIP_REASONS.map((k) => [k, Number(r[SKIP_COLUMN[k]])])) as Record<SkipReason, number>,
    createdBy: r.created_by as string,
    createdAt: r.created_at as Date,
    startedAt: (r.started_at as Date | null) ?? null,
    finishedAt: (r.finished_at as Date | null) ?? null,
    updatedAt: r.updated_at as Date,
  };
}

export async function insertJob(
  em: Queryable,
  j: { couponId: string; key: string; reason: string; fromStock: boolean; createdBy: string },
  at: Date,
): Promise<string> {
  const res = (await em.query(
    `INSERT INTO issuance_job (coupon_id, idempotency_key, reason, from_stock, status, created_by, created_at, updated_at)
     VALUES (?, ?, ?, ?, 'UPLOADING', ?, ?, ?)`,
    [j.couponId, j.key, j.reason, j.fromStock, j.createdBy, at, at],
  )) as { insertId: number | string };
  return String(res.insertId);
}

export async function findJob(em: Queryable, id: string, lock = false): Promise<Job | null> {
  const [row] = (await em.query(`SELECT * FROM issuance_job WHERE id = ?${lock ? ' FOR UPDATE' : ''}`, [id])) as Record<string, unknown>[];
  return row ? toJob(row) : null;
}

/** Jobs newest first, from the primary key; uploads not yet (or never to be) answered are not listed. */
export async function listJobs(em: Queryable, couponId: string | undefined, beforeId: string | undefined, limit: number): Promise<Job[]> {
  const rows = (await em.query(
    `SELECT * FROM issuance_job WHERE status NOT IN ('UPLOADING', 'DISCARDED')${couponId ? ' AND coupon_id = ?' : ''}${beforeId ? ' AND id < ?' : ''}
     ORDER BY id DESC LIMIT ?`,
    [...(couponId ? [couponId] : []), ...(beforeId ? [beforeId] : []), limit],
  )) as Record<string, unknown>[];
  return rows.map(toJob);
}

export async function findJobByKey(em: Queryable, key: string): Promise<Job | null> {
  const [row] = (await em.query(`SELECT * FROM issuance_job WHERE idempotency_key = ?`, [key])) as Record<string, unknown>[];
  return row ? toJob(row) : null;
}

/**
 * Adds a chunk of an upload's lines (the invalid ones counted as skipped right away), in the caller's transaction. The job row first, and only while
 * it is UPLOADING: its row lock then keeps a discard out until the chunk commits. False (nothing
 * written) when the upload was discarded meanwhile.
 */
export async function appendLines(
  em: Queryable,
  jobId: string,
  lines: readonly { lineNo: number; userId: string }[],
  invalid: readonly { lineNo: number; userId: string }[],
  at: Date,
): Promise<boolean> {
  const res = (await em.query(
    `UPDATE issuance_job SET total = total + ?, skipped_invalid = skipped_invalid + ?, updated_at = ? WHERE id = ? AND status = 'UPLOADING'`,
    [lines.length + invalid.length, invalid.length, at, jobId],
  )) as { affectedRows: number };
  if (res.affectedRows !== 1) return false;
  if (lines.length > 0) {
    await em.query(
      `INSERT INTO issuance_job_line (job_id, line_no, user_id) VALUES ${lines.map(() => '(?, ?, ?)').join(', ')}`,
      lines.flatMap((l) => [jobId, l.lineNo, l.userId]),
    );
  }
  await insertSkips(
    em,
    jobId,
    invalid.map((l) => ({ ...l, reason: 'INVALID_USER_ID' as const })),
  );
  return true;
}

export async function insertSkips(em: Queryable, jobId: string, skips: readonly { lineNo: number; userId: string; reason: SkipReason }[]) {
  if (skips.length === 0) return;
  await em.query(
    `INSERT INTO issuance_job_skip (job_id, line_no, user_id, reason) VALUES ${skips.map(() => '(?, ?, ?, ?)').join(', ')}`,
    skips.flatMap((s) => [jobId, s.lineNo, s.userId, s.reason]),
  );
}

/** UPLOADING -> QUEUED once the whole list is stored, with its digest; false if the upload was discarded meanwhile. */
export async function queueUpload(em: Queryable, id: string, listDigest: string, at: Date): Promise<boolean> {
  const res = (await em.query(
    `UPDATE issuance_job SET status = 'QUEUED', list_digest = ?, updated_at = ? WHERE id = ? AND status = 'UPLOADING'`,
    [listDigest, at, id],
  )) as { affectedRows: number };
  return res.affectedRows === 1;
}

/** A compare-and-set on the job's status; returns whether it moved. */
export async function setJobStatus(em: EntityManager, id: string, from: readonly JobStatus[], to: JobStatus, at: Date): Promise<boolean> {
  const stamps =
    to === 'RUNNING'
      ? ', started_at = COALESCE(started_at, ?)'
      : ['COMPLETED', 'FAILED', 'CANCELLED'].includes(to)
        ? ', finished_at = ?'
        : '';
  return (
    (await execute(
      em,
      `UPDATE issuance_job SET status = ?, updated_at = ?${stamps} WHERE id = ? AND status IN (${from.map(() => '?').join(', ')})`,
      [to, at, ...(stamps ? [at] : []), id, ...from],
    )) === 1
  );
}

/** Whether the user id of line `l` stands on an earlier line of its job's list (a DUPLICATE); index hint: see nextLines. */
const REPEATED = `EXISTS (SELECT 1 FROM issuance_job_line e FORCE INDEX (idx_issuance_line_user)
                   WHERE e.job_id = l.job_id AND e.user_id = l.user_id AND e.line_no < l.line_no)`;

/**
 * The next lines to decide, from `fromLine` on, each flagged when the same user id stands on an earlier line of the list.
 * The index hints are needed: MariaDB 10.11 often plans the repeat check as a scan of the job's
 * lines by primary key prefix (it did both before and after the table's statistics caught up with
 * a fresh upload), which makes every batch read the whole list: 10-15 s a batch at 50,000 lines
 * instead of 30 ms.
 */
export async function nextLines(em: Queryable, jobId: string, fromLine: number, limit: number) {
  const rows = (await em.query(
    `SELECT l.line_no, l.user_id, ${REPEATED} AS dup
     FROM issuance_job_line l FORCE INDEX (PRIMARY) WHERE l.job_id = ? AND l.line_no >= ? ORDER BY l.line_no LIMIT ?`,
    [jobId, fromLine, limit],
  )) as { line_no: number; user_id: string; dup: number | string }[];
  return rows.map((r) => ({ lineNo: Number(r.line_no), userId: r.user_id, duplicate: Number(r.dup) === 1 }));
}

/**
 * The lines after `afterLine` that the job has not reached (from its next_line on, read with each
 * page: a running job moves on), in line order, but for repeats of an earlier line, which the job
 * would skip as DUPLICATE: the users it would still have tried to issue to.
 */
export async function unprocessedLines(em: Queryable, jobId: string, afterLine: number, limit: number) {
  const rows = (await em.query(
    `SELECT l.line_no, l.user_id FROM issuance_job_line l FORCE INDEX (PRIMARY)
     WHERE l.job_id = ? AND l.line_no >= (SELECT next_line FROM issuance_job WHERE id = ?) AND l.line_no > ? AND NOT ${REPEATED}
     ORDER BY l.line_no LIMIT ?`,
    [jobId, jobId, afterLine, limit],
  )) as { line_no: number; user_id: string }[];
  return rows.map((r) => ({ line: Number(r.line_no), userId: r.user_id }));
}

/** Records a decided batch: the cursor moves past it and the counters grow, in the batch's transaction. */
export async function recordBatch(
  em: EntityManager,
  jobId: string,
  nextLine: number,
  issued: number,
  skipped: Record<SkipReason, number>,
  at: Date,
) {
  await em.query(
    `UPDATE issuance_job SET next_line = ?, issued = issued + ?, ${SKIP_REASONS.map((k) => `${SKIP_COLUMN[k]} = ${SKIP_COLUMN[k]} + ?`).join(', ')}, updated_at = ? WHERE id = ?`,
    [nextLine, issued, ...SKIP_REASONS.map((k) => skipped[k]), at, jobId],
  );
}

/** The job to run next: one already running (a restart resumes it), else the oldest queued. */
export async function nextRunnableJob(em: Queryable): Promise<Job | null> {
  const [row] = (await em.query(
    `SELECT * FROM issuance_job WHERE status IN ('RUNNING', 'QUEUED') ORDER BY status = 'RUNNING' DESC, id LIMIT 1`,
  )) as Record<string, unknown>[];
  return row ? toJob(row) : null;
}

/**
 * An upload in progress moves its job's updated_at at least this often (its chunks, else a
 * heartbeat), so one still for STALE_UPLOAD_MS has lost the instance receiving it.
 */
export const UPLOAD_HEARTBEAT_MS = 5000;
export const STALE_UPLOAD_MS = 30_000;

/** The upload is alive: see UPLOAD_HEARTBEAT_MS. */
export async function touchUpload(em: Queryable, jobId: string, at: Date): Promise<void> {
  await em.query(`UPDATE issuance_job SET updated_at = ? WHERE id = ? AND status = 'UPLOADING'`, [at, jobId]);
}

/** Out of sight, its key free: one single-row write; its lines, possibly a million, are deleted later in small statements (purgeDiscarded). */
const DISCARD = `UPDATE issuance_job SET status = 'DISCARDED', idempotency_key = CONCAT('discarded:', id), updated_at = ? WHERE status = 'UPLOADING'`;

/**
 * Discards an upload that was refused or broke off (its key is free again); with `olderThan`, only
 * if it has been still since then. Returns whether it did.
 */
export async function discardUpload(em: Queryable, jobId: string, at: Date, olderThan?: Date): Promise<boolean> {
  const res = (await em.query(
    `${DISCARD} AND id = ?${olderThan ? ' AND updated_at < ?' : ''}`,
    olderThan ? [at, jobId, olderThan] : [at, jobId],
  )) as { affectedRows: number };
  return res.affectedRows === 1;
}

/** Uploads that have written nothing since `olderThan` (the instance receiving them died) are discarded. */
export async function discardStaleUploads(em: Queryable, olderThan: Date, at: Date): Promise<void> {
  await em.query(`${DISCARD} AND updated_at < ?`, [at, olderThan]);
}

export async function discardedJobs(em: Queryable): Promise<string[]> {
  return ((await em.query(`SELECT id FROM issuance_job WHERE status = 'DISCARDED'`)) as { id: string }[]).map((r) => String(r.id));
}

/** Deletes up to `limit` rows of a discarded job (lines, then skips, then the job); returns how many went. */
export async function purgeDiscarded(em: Queryable, jobId: string, limit: number): Promise<number> {
  for (const table of ['issuance_job_line', 'issuance_job_skip']) {
    const res = (await em.query(`DELETE FROM ${table} WHERE job_id = ? LIMIT ?`, [jobId, limit])) as { affectedRows: number };
    if (res.affectedRows > 0) return res.affectedRows;
  }
  const res = (await em.query(`DELETE FROM issuance_job WHERE id = ? AND status = 'DISCARDED'`, [jobId])) as { affectedRows: number };
  return res.affectedRows;
}

/**
 * A job's skipped lines after `afterLine`, in line order; of one reason when `reason` is given. That
 * one's index hint is needed: MariaDB plans it as a walk of the job's skips by primary key, filtering
 * on the reason (it did with half of a 6,000-line job's skips of that reason), which reads the whole
 * job for a page of a rare reason, where idx_issuance_skip_reason reads the page's rows only.
 */
export async function listSkips(em: Queryable, jobId: string, reason: SkipReason | undefined, afterLine: number, limit: number) {
  const rows = (await em.query(
    reason
      ? `SELECT line_no, user_id, reason FROM issuance_job_skip FORCE INDEX (idx_issuance_skip_reason)
         WHERE job_id = ? AND reason = ? AND line_no > ? ORDER BY line_no LIMIT ?`
      : `SELECT line_no, user_id, reason FROM issuance_job_skip WHERE job_id = ? AND line_no > ? ORDER BY line_no LIMIT ?`,
    [jobId, ...(reason ? [reason] : []), afterLine, limit],
  )) as { line_no: number; user_id: string; reason: SkipReason }[];
  return rows.map((r) => ({ line: Number(r.line_no), userId: r.user_id, reason: r.reason }));
}
