import { TextDecoder } from 'node:util';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { AppError } from './errors.js';
import { validationFailed } from './validation.js';

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** 415 for a body of a type the route does not take. */
export const unsupportedMediaType = (req: FastifyRequest) =>
  new AppError(
    'UNSUPPORTED_MEDIA_TYPE',
    `Content-Type ${(req.headers['content-type'] ?? '').split(';')[0].trim().slice(0, 64) || '(none)'} is not accepted on this route`,
  );

/**
 * JSON bodies, decoded strictly and parsed as JSON.parse does. Fastify's parser turned bytes that
 * are not UTF-8 into U+FFFD, so order numbers the client sent as different ("ORD-1-\xff",
 * "ORD-1-\xfe") arrived as one, and the second order was answered as a replay of the first; such a
 * body is now 400. `__proto__` and `constructor` stay plain fields, which the validation pipe and
 * the input guard refuse naming them. An empty body is no body, as without the Content-Type.
 */
export function strictJsonBodies(fastify: FastifyInstance): void {
  // A compressed body is not decompressed: 415 says so, where its bytes read as "not UTF-8". A
  // callback hook: an async one costs every request two more promises.
  fastify.addHook('preParsing', (req, _reply, payload, done) => {
    const encoding = req.headers['content-encoding']?.trim().toLowerCase();
    if (encoding && encoding !== 'identity')
      return done(
        new AppError('UNSUPPORTED_MEDIA_TYPE', `Content-Encoding ${encoding.slice(0, 64)} is not supported; send the body uncompressed`),
      );
    done(null, payload);
  });
  // Every other type is refused unread, except an empty body: Content-Length 0 is no body whatever
  // it is labelled (fetch labels `body: ''` text/plain, curl labels `-d ''` a form), and so is a
  // chunked body that ends before its first byte.
  fastify.addContentTypeParser('*', (req, payload, done) => {
    // An unknown route is 404 whatever its body, as when no parser matched.
    if (req.is404 || req.headers['content-length'] === '0') return done(null, undefined);
    if (req.headers['content-length'] !== undefined) return done(unsupportedMediaType(req), undefined);
    const settle = (err: Error | null) => {
      payload.off('data', onData).off('end', onEnd).off('error', settle);
      // Paused, the rest of a refused body is left to UnreadBodies, as one with a length.
      payload.pause();
      done(err, undefined);
    };
    const onData = (chunk: Buffer) => {
      if (chunk.length > 0) settle(unsupportedMediaType(req));
    };
    const onEnd = () => settle(null);
    payload.on('data', onData).on('end', onEnd).on('error', settle);
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
