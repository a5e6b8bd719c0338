import type { FastifyInstance } from 'fastify';

/** The CSVs of a job's lines (skipped, not processed), as Fastify spells their routes. */
const CSV_ROUTES = ['/admin/issuance-jobs/:jobId/skipped.csv', '/admin/issuance-jobs/:jobId/unprocessed.csv'];

/**
 * The file's first line: one the upload takes for a header and passes over (user-id-lines.ts), so
 * the file goes back up as a job's list as it is.
 */
export const USER_ID_CSV_HEADER = 'user_id\r\n';

/**
 * One line of the file (RFC 4180: CRLF). A skipped user id is written as it is, a leading `-`
 * included: it holds no parenthesis, quote, space or `|`, so a spreadsheet cannot call anything with
 * it, and an edited one would no longer upload as the same user. The text of an INVALID_USER_ID line
 * may hold anything, and is its first 64 characters only: it is written after a `'`, so that it can
 * neither upload again as a user id (not even when those 64 characters make one) nor start a formula,
 * with its control characters as spaces (line breaks: the upload reads a line as one entry, quoted or
 * not; tabs; NUL, which a spreadsheet may cut the file at), and
 * quoted when it holds a quote, comma or semicolon (the separators spreadsheets split on).
 */
export function skippedCsvLine(userId: string, reason: string): string {
  if (reason !== 'INVALID_USER_ID') return `${userId}\r\n`;
  const text = `'${userId.replace(/\p{Cc}/gu, ' ')}`;
  return /[",;]/.test(text) ? `"${text.replaceAll('"', '""')}"\r\n` : `${text}\r\n`;
}

/**
 * Gives the CSVs the deadline of an upload (BULK_UPLOAD_TIMEOUT_MS): a million lines may take longer
 * than REQUEST_TIMEOUT_MS to reach a slow client, and Fastify cuts a response still streaming at its
 * handler's deadline. Must run before the routes are registered (app.init()).
 */
export function giveLineCsvsTime(fastify: FastifyInstance, timeoutMs: number): void {
  fastify.addHook('onRoute', (route) => {
    if (CSV_ROUTES.includes(route.url)) route.handlerTimeout = timeoutMs;
  });
}
