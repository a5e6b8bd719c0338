import { ArgumentsHost, Catch, ExceptionFilter, HttpException } from '@nestjs/common';
import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from 'fastify';
import { isDatabaseOutage, outageMessage } from './db-errors.js';
import { awaitsContinue } from './expect-continue.js';
import { AppError, ErrorCode } from './errors.js';
import { languageOf, messageFor } from './messages.js';

/** What Fastify sends for an object: the same header for the answers written without it. */
export const JSON_TYPE = 'application/json; charset=utf-8';

const BY_STATUS: Record<number, ErrorCode> = {
  400: 'VALIDATION_FAILED',
  401: 'UNAUTHENTICATED',
  403: 'FORBIDDEN',
  404: 'NOT_FOUND',
  413: 'PAYLOAD_TOO_LARGE',
  415: 'UNSUPPORTED_MEDIA_TYPE',
  429: 'RATE_LIMITED',
  503: 'SERVICE_UNAVAILABLE',
};

/**
 * Turns anything thrown into the one error body of API.md. Client mistakes caught by Fastify or Nest
 * (bad JSON, body too large, unknown route) keep their 4xx; database outages become 503; anything
 * else is a bug, logged and answered 500. `log` is the request's logger, so both carry its request id.
 */
export function toAppError(err: unknown, log: FastifyBaseLogger): AppError {
  if (err instanceof AppError) return err;
  if (err instanceof HttpException) {
    const status = err.getStatus();
    // A library's 403, which Nest wraps keeping it as the cause: the docs' file server refusing a path
    // with dot or empty segments (/docs//swagger-ui.css). No such file, not a role the caller lacks.
    if (status === 403 && err.cause !== undefined) return new AppError('NOT_FOUND', 'Route not found');
    const code = BY_STATUS[status] ?? (status < 500 ? 'VALIDATION_FAILED' : 'INTERNAL');
    return new AppError(code, status === 404 ? 'Route not found' : err.message);
  }
  const fst = err as { statusCode?: number; code?: string; message?: string };
  if (typeof fst?.statusCode === 'number' && fst.statusCode >= 400 && fst.statusCode < 500) {
    const code = BY_STATUS[fst.statusCode] ?? 'VALIDATION_FAILED';
    const message = code === 'VALIDATION_FAILED' ? `Malformed request: ${fst.message ?? 'bad input'}` : (fst.message ?? code);
    return new AppError(code, message, fst.code ? { reason: fst.code } : undefined);
  }
  if (isDatabaseOutage(err)) {
    const e = err as { code?: string; errno?: number; message?: string };
    log.warn({ dbCode: e.code, errno: e.errno }, `Answering 503 for a database error: ${e.message ?? String(err)}`);
    return new AppError('SERVICE_UNAVAILABLE', outageMessage(err), undefined, { 'Retry-After': '1' });
  }
  log.error({ err }, 'Answering 500 for an unexpected error');
  return new AppError('INTERNAL', 'Internal error');
}

/**
 * Fastify's handlerTimeout fired (REQUEST_TIMEOUT_MS): the client's slowness if its body had not all
 * arrived, else ours; ours too when the server had not yet asked for the body (100 Continue held back).
 */
function deadlineError(request: FastifyRequest): AppError {
  return request.raw.complete || awaitsContinue(request.raw)
    ? deadlinePassed()
    : new AppError('REQUEST_TIMEOUT', 'The request took too long to arrive', undefined, { Connection: 'close' });
}

/** A request whose whole body arrived was not answered within REQUEST_TIMEOUT_MS. */
export function deadlinePassed(): AppError {
  return new AppError('SERVICE_UNAVAILABLE', 'The request did not finish within its deadline; retry shortly', undefined, {
    'Retry-After': '1',
  });
}

@Catch()
export class HttpExceptionFilter implements ExceptionFilter {
  catch(exception: unknown, host: ArgumentsHost): void {
    const http = host.switchToHttp();
    const request = http.getRequest<FastifyRequest>();
    const reply = http.getResponse<FastifyReply>();
    // A handler that fails after its deadline was answered (an upload whose client was cut off) has
    // no one left to tell.
    if (reply.sent) return;
    const e =
      (exception as { code?: unknown } | null)?.code === 'FST_ERR_HANDLER_TIMEOUT'
        ? deadlineError(request)
        : toAppError(exception, request.log);
    sendError(request, reply, e);
  }
}

/** The one error answer: status, headers, the body in the request's language. */
export function sendError(request: FastifyRequest, reply: FastifyReply, e: AppError): void {
  request.errorCode = e.code;
  const { headers, body } = errorAnswer(e, request.headers['accept-language']);
  void reply.headers(headers);
  void reply.status(e.status).send(body);
}

/** The headers and body of the one error answer, in the language asked for. */
export function errorAnswer(
  e: AppError,
  acceptLanguage: string | undefined,
): { headers: Record<string, string>; body: { code: string; message: string; details?: unknown } } {
  const language = languageOf(acceptLanguage);
  const body: { code: string; message: string; details?: unknown } = { code: e.code, message: messageFor(e.code, language, e.message) };
  if (e.details) body.details = e.details;
  // Built by assignment, as every sold-out grab is answered this way: see AheadExchange.send.
  const headers = Object.assign({}, e.headers);
  // The body is JSON even when the route declared another type for its success (GET /metrics).
  headers['content-type'] = JSON_TYPE;
  if (language !== 'en') headers['content-language'] = language;
  return { headers, body };
}
