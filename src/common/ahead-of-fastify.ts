import type { IncomingMessage, OutgoingHttpHeaders, RequestListener, Server, ServerResponse } from 'node:http';
import type { FastifyBaseLogger } from 'fastify';
import type { Logger } from 'pino';
import { asError, type ErrorCode } from './errors.js';
import { errorAnswer, toAppError } from './http-exception.filter.js';
import { logRequest, type RequestLine, requestIdOf } from './request-log.js';
import { hostProblem } from './validation.js';

export interface AheadOfFastify {
  /** The server is closing: its refusal of a new request is Fastify's to answer. */
  isClosing(): boolean;
  /** The instance is stopping (draining or closing): every answer closes its connection. */
  isStopping(): boolean;
  /** CORS_ORIGINS is set: an answer varies on Origin, and a request with one is left to the CORS hook. */
  cors: boolean;
  /** The app's logger, whose request lines these answers' lines must match. */
  log: Logger;
}

/**
 * A route answered ahead of Fastify: for a request it takes, its route pattern (for the log line and
 * the metric) and what answers it; undefined leaves the request to Fastify. Deciding must not throw
 * for what a client sends; a throw leaves the request to Fastify all the same.
 */
export type AheadRoute = (req: IncomingMessage) => { route: string; take: (exchange: AheadExchange) => void } | undefined;

/**
 * One request answered ahead of Fastify, with what every answer of Fastify's way has: X-Request-Id
 * (the client's when valid), Vary: Origin under CORS (the CORS hook's), Connection: close once the
 * instance is stopping (UnreadBodies.settle's), the error format of the one filter, and the log line
 * and duration metric once the answer is written, as Fastify logs: an answer queued behind a
 * pipelined one and lost with its connection is none.
 */
export class AheadExchange {
  readonly id: string;
  /** The user the request acts for, for its log line. */
  user?: string;

  constructor(
    readonly req: IncomingMessage,
    readonly res: ServerResponse,
    private readonly route: string,
    private readonly arrived: number,
    private readonly options: AheadOfFastify,
  ) {
    this.id = requestIdOf(req);
  }

  /** Whether the request has its answer (or its connection has gone): nothing more is sent then. */
  get answered(): boolean {
    return this.res.headersSent || this.res.destroyed;
  }

  // Built by assignment: the conditional spreads this replaced took about 3 µs an answer (V8 builds
  // such objects slowly), a few per cent of a page's server CPU, in a loop of 2 million on this machine.
  send(status: number, headers: OutgoingHttpHeaders, body: Buffer | string, code?: ErrorCode): void {
    if (this.answered) return;
    const head = Object.assign({}, headers);
    if (this.options.cors) head.vary = headers.vary === undefined ? 'Origin' : `Origin, ${String(headers.vary)}`;
    head['x-request-id'] = this.id;
    if (this.options.isStopping()) head.connection = 'close';
    head['content-length'] = Buffer.byteLength(body);
    this.res.writeHead(status, head);
    this.res.once('finish', () => {
      const { method, url } = this.req as { method: string; url: string };
      const line: RequestLine = { method, url, route: this.route, status, ms: performance.now() - this.arrived };
      if (code) line.code = code;
      if (this.user) line.user = this.user;
      logRequest(this.options.log, line, this.id);
    });
    this.res.end(body);
  }

  /** Answers what was thrown as the one exception filter would. */
  fail(err: unknown): void {
    if (this.answered) return;
    const e = toAppError(asError(err), this.options.log.child({ reqId: this.id }) as FastifyBaseLogger);
    const { headers, body } = errorAnswer(e, this.req.headers['accept-language']);
    this.send(e.status, headers, JSON.stringify(body), e.code);
  }
}

/**
 * No body by Fastify's own rule, and nothing its body hooks would refuse: Fastify runs a body parser
 * (which refuses a Content-Type no route takes, or a malformed one) for any Content-Length but the
 * exact "0" (so "00" is a body), and json-body.ts refuses any Content-Encoding but on a GET or HEAD,
 * a body or none (declined on those too: Fastify's way answers them alike).
 */
function hasNoBody({ method, headers }: IncomingMessage): boolean {
  const length = headers['content-length'];
  return (
    headers['transfer-encoding'] === undefined &&
    (length === undefined || length === '0') &&
    headers['content-encoding'] === undefined &&
    (method === 'GET' || method === 'HEAD' || headers['content-type'] === undefined)
  );
}

/**
 * Answers the routes given in the server's own request listener, before Fastify's, skipping
 * Fastify's own work for a request (its request and reply, routing, the hooks, the reply's headers):
 * it took the public page's server CPU per answer from 0.10-0.12 ms to 0.07-0.08 (BENCHMARKS.md).
 * Only a request no hook of Fastify's way would answer or change is offered to them: one with a
 * Host and no body (hasNoBody), no Origin where CORS is on, while the server is not closing, and a path
 * Fastify's router would read as sent (no `%`-escapes, no `#`). Each route checks the rest (method,
 * path, query, headers) and declines what its Fastify route would answer otherwise; every other
 * request goes to Fastify's listener.
 *
 * A Fastify plugin or hook added later does not see these answers: what it does must be done here too.
 */
export function answerAheadOfFastify(server: Server, options: AheadOfFastify, routes: AheadRoute[]): void {
  const listeners = server.listeners('request') as RequestListener[];
  if (listeners.length !== 1) throw new Error(`ahead-of-fastify.ts expects Fastify's request listener alone, found ${listeners.length}`);
  const [fastifyListener] = listeners;
  const offered = (req: IncomingMessage) =>
    req.url !== undefined &&
    req.headers.host !== undefined &&
    hostProblem(req) === null &&
    !(options.cors && req.headers.origin !== undefined) &&
    hasNoBody(req) &&
    !options.isClosing() &&
    // Fastify's router also ends the path at '#', and decodes %-escapes: those are left to it.
    !req.url.includes('#') &&
    !req.url.includes('%');
  const routed = (req: IncomingMessage) => {
    if (!offered(req)) return undefined;
    for (const route of routes) {
      const taken = route(req);
      if (taken) return taken;
    }
    return undefined;
  };
  server.removeListener('request', fastifyListener);
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const arrived = performance.now();
    let taken: ReturnType<AheadRoute>;
    try {
      taken = routed(req);
    } catch {
      // Thrown in this listener it would end the process; Fastify's way answers it with the filter's 500.
      taken = undefined;
    }
    if (!taken) return fastifyListener.call(server, req, res);
    const exchange = new AheadExchange(req, res, taken.route, arrived, options);
    try {
      taken.take(exchange);
    } catch (err) {
      exchange.fail(err);
    }
  });
}
