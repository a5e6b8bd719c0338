import { Transform } from 'node:stream';
import type { FastifyInstance, FastifyRequest, preParsingHookHandler } from 'fastify';
import { AppError } from '../common/errors.js';
import { unsupportedMediaType } from '../common/json-body.js';
import { asList } from '../common/route-hooks.js';
import { CSV_MAX_BYTES, csvTooLarge, uploadStalled } from './user-id-lines.js';

/** The one route that takes a list of users, as Fastify spells it. */
export const ISSUANCE_ROUTE = '/admin/coupons/:couponId/issuances';

/** Whether the request's Content-Type is `type` (lower case), parameters aside. */
const mediaTypeIs = (req: FastifyRequest, type: string) =>
  (req.headers['content-type'] ?? '').split(';')[0].trimEnd().toLowerCase() === type;

export const isCsv = (req: FastifyRequest) => mediaTypeIs(req, 'text/csv');

/**
 * The most a JSON list may take: 10,000 ids of 64 characters, quoted, one per indented line, and a
 * reason come to under 800 KB. The route's own limit is the CSV's 64 MiB, which JSON.parse would
 * hold the event loop for, for a second, in one piece.
 */
export const JSON_LIST_MAX_BYTES = 1024 * 1024;

const jsonListTooLarge = () =>
  new AppError('PAYLOAD_TOO_LARGE', `A JSON list of users may take ${JSON_LIST_MAX_BYTES} bytes; send a longer one as text/csv`, {
    maxBytes: JSON_LIST_MAX_BYTES,
  });

/**
 * Lets the issuance route take what no other route takes: a JSON list larger than the 64 KiB every
 * other body is held to (up to JSON_LIST_MAX_BYTES), a text/csv body handed over as a stream
 * (user-id-lines.ts counts its 64 MiB), and a deadline long enough for a million lines to arrive and
 * be stored (BULK_UPLOAD_TIMEOUT_MS instead of REQUEST_TIMEOUT_MS). Must run before the routes are
 * registered (app.init()).
 */
export function acceptIssuanceUploads(fastify: FastifyInstance, uploadTimeoutMs: number): void {
  fastify.addHook('onRoute', (route) => {
    if (route.url !== ISSUANCE_ROUTE) return;
    route.bodyLimit = CSV_MAX_BYTES;
    route.handlerTimeout = uploadTimeoutMs;
    // Hooks of this route only: no other request pays for them.
    route.preParsing = [...asList(route.preParsing), capUpload];
  });
  fastify.addContentTypeParser('text/csv', (req, payload, done) => {
    // An unknown route is 404 whatever its body, as with the other types (json-body.ts).
    if (req.is404) return done(null, undefined);
    if (req.routeOptions.url !== ISSUANCE_ROUTE) return done(unsupportedMediaType(req), undefined);
    done(null, payload);
  });
}

/**
 * Holds a JSON body to JSON_LIST_MAX_BYTES, by its length before it is read, else as it arrives
 * (chunked), and a CSV to CSV_MAX_BYTES by its length. Only these two: a body of another type is
 * 415 as on every route, not a list's 413. A JSON list that stops arriving is 408 (uploadStalled).
 */
const capUpload: preParsingHookHandler = (req, _reply, payload, done) => {
  if (isCsv(req) && Number(req.headers['content-length']) > CSV_MAX_BYTES) return done(csvTooLarge());
  if (!mediaTypeIs(req, 'application/json')) return done(null, payload);
  if (Number(req.headers['content-length']) > JSON_LIST_MAX_BYTES) return done(jsonListTooLarge());
  let received = 0;
  const counted = new Transform({
    transform(chunk: Buffer, _encoding, next) {
      received += chunk.length;
      next(received > JSON_LIST_MAX_BYTES ? jsonListTooLarge() : null, chunk);
    },
  });
  const stalled = () => counted.destroy(uploadStalled());
  req.raw.once('timeout', stalled);
  counted.once('close', () => req.raw.off('timeout', stalled));
  // pipe, not pipeline: a body over the cap is left unread for UnreadBodies (common/unread-body.ts)
  // to drop, where pipeline destroyed it, and with it the connection under a client still sending.
  payload.on('error', (err) => counted.destroy(err));
  done(null, payload.pipe(counted));
};
