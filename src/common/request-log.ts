import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { ErrorCode } from './errors.js';
import { httpDuration } from './metrics.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by the exception filter: the code answered. */
    errorCode?: ErrorCode;
  }
}

/** One line per request, after the answer: what was asked, by whom, what was answered, how fast. */
export function onResponse(req: FastifyRequest, reply: FastifyReply): void {
  const route = req.routeOptions.url ?? 'unmatched';
  const status = reply.statusCode;
  httpDuration.observe({ method: req.method, route, status: String(status) }, reply.elapsedTime / 1000);
  const level = status >= 500 ? 'error' : 'info';
  // The app's logger is pino (app.factory.ts); skipping the line's object when it is off costs a benchmark nothing.
  if (!(req.log as Logger).isLevelEnabled(level)) return;
  req.log[level](
    {
      method: req.method,
      url: req.url,
      route,
      status,
      ...(req.errorCode ? { code: req.errorCode } : {}),
      ...(req.principal ? { user: req.principal.userId } : {}),
      ms: Math.round(reply.elapsedTime * 10) / 10,
    },
    'request',
  );
}
