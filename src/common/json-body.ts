import { TextDecoder } from 'node:util';
import type { FastifyInstance } from 'fastify';
import { AppError } from './errors.js';
import { validationFailed } from './validation.js';

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * JSON bodies, decoded strictly and parsed as JSON.parse does. Fastify's parser turned bytes that
 * are not UTF-8 into U+FFFD, so order numbers the client sent as different ("ORD-1-\xff",
 * "ORD-1-\xfe") arrived as one, and the second order was answered as a replay of the first; such a
 * body is now 400. `__proto__` and `constructor` stay plain fields, which the validation pipe and
 * the input guard refuse naming them. An empty body is no body, as without the Content-Type.
 */
export function strictJsonBodies(fastify: FastifyInstance): void {
  // A compressed body is not decompressed: 415 says so, where its bytes read as "not UTF-8".
  fastify.addHook('preParsing', async (req) => {
    const encoding = req.headers['content-encoding']?.trim().toLowerCase();
    if (encoding && encoding !== 'identity')
      throw new AppError(
        'UNSUPPORTED_MEDIA_TYPE',
        `Content-Encoding ${encoding.slice(0, 64)} is not supported; send the body uncompressed`,
      );
  });
  fastify.removeContentTypeParser('application/json');
  fastify.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => {
    if (body.length === 0) return done(null, undefined);
    let text: string;
    try {
      text = utf8.decode(body as Buffer);
    } catch {
      return done(validationFailed({ body: ['must be UTF-8 text'] }, 'The body is not UTF-8 text'), undefined);
    }
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(validationFailed({ body: [`is not valid JSON (${(err as Error).message})`] }, 'The body is not valid JSON'), undefined);
    }
  });
}
