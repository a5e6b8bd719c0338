import type { FastifyInstance, FastifyRequest } from 'fastify';
import { CSV_MAX_BYTES } from './user-id-lines.js';

/** The one route that takes a list of users, as Fastify spells it. */
export const ISSUANCE_ROUTE = '/admin/coupons/:couponId/issuances';

export const isCsv = (req: FastifyRequest) => /^text\/csv\s*(;|$)/i.test(req.headers['content-type'] ?? '');

/**
 * Lets the issuance route take what no other route takes: a JSON list larger than the 64 KiB every
 * other body is held to, a text/csv body handed over as a stream (user-id-lines.ts counts its
 * 64 MiB), and a deadline long enough for a million lines to arrive and be stored
 * (BULK_UPLOAD_TIMEOUT_MS instead of REQUEST_TIMEOUT_MS). Must run before the routes are
 * registered (app.init()).
 */
export function acceptIssuanceUploads(fastify: FastifyInstance, uploadTimeoutMs: number): void {
  fastify.addHook('onRoute', (route) => {
    if (route.url !== ISSUANCE_ROUTE) return;
    route.bodyLimit = CSV_MAX_BYTES;
    route.handlerTimeout = uploadTimeoutMs;
  });
  fastify.addContentTypeParser('text/csv', (req, payload, done) => {
    if (req.routeOptions.url !== ISSUANCE_ROUTE) {
      done(
        Object.assign(new Error(`Unsupported Media Type: text/csv`), { statusCode: 415, code: 'FST_ERR_CTP_INVALID_MEDIA_TYPE' }),
        undefined,
      );
      return;
    }
    done(null, payload);
  });
}
