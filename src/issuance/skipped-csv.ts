import type { FastifyInstance } from 'fastify';
import { USER_ID_PATTERN } from '../common/validation.js';

/** The CSV of a job's skipped lines, as Fastify spells its route. */
export const SKIPPED_CSV_ROUTE = '/admin/issuance-jobs/:jobId/skipped.csv';

/**
 * The file's first line: one the upload takes for a header and passes over (user-id-lines.ts), so
 * the file goes back up as a job's list as it is.
 */
export const SKIPPED_CSV_HEADER = 'user_id\r\n';

/** A spreadsheet takes a cell starting with one of these for a formula (CSV injection). */
const FORMULA_START = /^[=+\-@\t\r]/;

/**
 * One line of the file (RFC 4180: CRLF). A user id is written as it is, a leading `-` included: it
 * holds no parenthesis, quote, space or `|`, so a spreadsheet cannot call anything with it, and an
 * edited one would no longer upload as the same user. The text of an invalid line may hold
 * anything (a JSON list's entries may even hold line breaks): one that a spreadsheet would run gets
 * a `'` in front, and one that is empty (a blank line would be no line at all) or holds a quote,
 * comma or line break is quoted.
 */
export function skippedCsvLine(userId: string): string {
  if (USER_ID_PATTERN.test(userId)) return `${userId}\r\n`;
  const text = FORMULA_START.test(userId) ? `'${userId}` : userId;
  return /^$|[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"\r\n` : `${text}\r\n`;
}

/**
 * Gives the CSV the deadline of an upload (BULK_UPLOAD_TIMEOUT_MS): a million lines may take longer
 * than REQUEST_TIMEOUT_MS to reach a slow client, and Fastify cuts a response still streaming at its
 * handler's deadline. Must run before the routes are registered (app.init()).
 */
export function giveSkippedCsvTime(fastify: FastifyInstance, timeoutMs: number): void {
  fastify.addHook('onRoute', (route) => {
    if (route.url === SKIPPED_CSV_ROUTE) route.handlerTimeout = timeoutMs;
  });
}
