import 'reflect-metadata';
import { randomUUID } from 'node:crypto';
import { type IncomingMessage, type ServerResponse, STATUS_CODES } from 'node:http';
import { Socket } from 'node:net';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, NestFastifyApplication } from '@nestjs/platform-fastify';
import { SwaggerModule } from '@nestjs/swagger';
import { LogController } from 'fastify';
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { AppModule } from './app.module.js';
import { AppConfig } from './config/app-config.js';
import { shuttingDown } from './common/errors.js';
import { HttpExceptionFilter, sendError } from './common/http-exception.filter.js';
import { continueWhenBodyRead } from './common/expect-continue.js';
import { isMalformedQuery, parseQueryString } from './common/query-string.js';
import { type AheadRoute, answerAheadOfFastify } from './common/ahead-of-fastify.js';
import { UnreadBodies } from './common/unread-body.js';
import { BODY_LIMIT_BYTES, strictJsonBodies } from './common/json-body.js';
import { createPino, PinoNestLogger } from './common/logger.js';
import { onResponse, requestIdOf } from './common/request-log.js';
import { hostProblem, StrictValidationPipe, UndeclaredInputGuard, validationFailed } from './common/validation.js';
import { type Deadline, deadlineOf, settleDeadline, withDeadline } from './database/deadline-pool.js';
import { serveConsole } from './console/serve-console.js';
import { giveLineCsvsTime } from './issuance/line-csvs.js';
import { acceptIssuanceUploads } from './issuance/upload.js';
import { CouponService } from './coupon/coupon.service.js';
import { publicReadsAheadOfFastify, servePublicReadsFromMemory } from './coupon/public-reads.js';
import { answerGrabsAheadOfNest, grabsAheadOfFastify } from './coupon/grab-ahead.js';
import { GrabService } from './coupon/grab.service.js';
import { Stopping } from './common/stopping.js';
import { buildOpenApiDocument } from './openapi/document.js';
import { HEADERS } from './openapi/schemas.js';

/**
 * An answer in the one error format written straight to a socket that never reaches the router,
 * with Connection: close, and its log line like a routed request's.
 */
function answerUnrouted(socket: Socket, log: Logger, id: string, status: number, code: string, message: string, method?: string): void {
  const body = JSON.stringify({ code, message });
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nContent-Type: application/json; charset=utf-8\r\nX-Request-Id: ${id}\r\nConnection: close\r\n\r\n${body}`,
  );
  log.info({ reqId: id, ...(method ? { method } : {}), route: 'unmatched', status, code }, 'request');
}

/**
 * The answer Node is writing on a socket, if any: the private field Node's own client-error handler
 * reads for the same question (a ServerResponse has no public link back to a socket it is queued on).
 */
function answerUnderWay(socket: Socket): ServerResponse | null {
  return (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage ?? null;
}

/**
 * Runs `then` once the answers Node has queued on the socket for whole requests have been written:
 * a request whose body never came whole (the broken bytes were in it) is answered by `then`.
 */
function afterWholeAnswers(socket: Socket, then: () => void): void {
  const res = answerUnderWay(socket);
  if (res === null || !res.req.complete) return then();
  // Node's own 'finish' listener, added first, has by now handed the socket to the next queued answer.
  res.once('finish', () => afterWholeAnswers(socket, then));
}

const answeringFirst = new WeakSet<Socket>();

/**
 * Requests too broken to reach the router (garbled request line, oversized headers) still get the
 * one error body. `closeWithinMs`: the longest a connection is kept for answers still under way.
 */
function clientErrorHandler(
  err: Error & { code?: string },
  socket: Socket,
  unread: UnreadBodies,
  log: Logger,
  closeWithinMs: number,
): void {
  if (err.code === 'ECONNRESET' || socket.destroyed || answeringFirst.has(socket)) return;
  const [status, code, message] =
    err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? [408, 'REQUEST_TIMEOUT', 'The request took too long to arrive']
      : err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'HEADERS_TOO_LARGE', 'Request headers are too large']
        : [400, 'VALIDATION_FAILED', 'Malformed HTTP request'];
  const refuse = () => {
    // A request whose answer already went (its refused body still arriving) gets no second one.
    if (socket.writable && !unread.isDraining(socket)) answerUnrouted(socket, log, randomUUID(), status, code, message);
  };
  // Bytes that break the framing after a whole request (one stray byte past its Content-Length, in
  // the same packet) must not cost that request its answer: it may already have committed, and a
  // 400 in its place would say nothing changed. Its answer, and any pipelined behind it, go first.
  const inFlight = answerUnderWay(socket);
  if (inFlight !== null && inFlight.req.complete) {
    answeringFirst.add(socket);
    // Nothing more is read: bytes still arriving kept the connection alive for as long as the client
    // went on sending them, an answer it never read included.
    socket.pause();
    const giveUp = setTimeout(() => socket.destroy(), closeWithinMs).unref();
    afterWholeAnswers(socket, () => {
      clearTimeout(giveUp);
      refuse();
      // Not the socket's own destroySoon, which unread-body.ts may have made a half-close.
      Socket.prototype.destroySoon.call(socket);
    });
    return;
  }
  refuse();
  socket.destroy(err);
}

/**
 * Lets the pages of CORS_ORIGINS call the API from a browser. A request from any other origin, or
 * none, gets no CORS headers (browsers then refuse the page its answer), and its OPTIONS stays 404.
 * Every request header a client sends and every header the service answers is listed, so a page
 * can replay a grab (Idempotency-Key) and read Retry-After and Idempotent-Replayed.
 */
function allowBrowserOrigins(app: NestFastifyApplication, origins: string): void {
  // As browsers send them: `https://shop.example.com:443` arrives as `https://shop.example.com`.
  const allowed = new Set(origins.split(',').map((o) => new URL(o).origin));
  app.enableCors({
    origin: (origin: string | undefined, cb: (err: Error | null, allow: string | false) => void) =>
      cb(null, origin !== undefined && allowed.has(origin) ? origin : false),
    methods: ['GET', 'POST', 'PATCH', 'DELETE'],
    allowedHeaders: ['Authorization', 'Content-Type', 'Idempotency-Key', 'X-Request-Id', 'Accept-Language'],
    exposedHeaders: Object.keys(HEADERS),
    maxAge: 600,
    // An OPTIONS from an allowed origin is a preflight even without Access-Control-Request-Method,
    // instead of @fastify/cors's plain-text 400.
    strictPreflight: false,
  });
}

/** Builds the whole app (not listening yet). main.ts, the tests and the benchmarks all start it this way. */
export async function createApp(
  config: AppConfig,
  extraModules: Parameters<typeof AppModule.forRoot>[1] = [],
  /** Routes of those modules answered ahead of Fastify too (the benchmark's no-op ceiling). */
  extraAheadRoutes: AheadRoute[] = [],
): Promise<NestFastifyApplication> {
  const pino = createPino(config);
  const stopping = new Stopping();
  const unread = new UnreadBodies(() => stopping.draining);
  // Node's limit is server-wide, so it leaves room for the one route with a longer deadline (a bulk
  // issuance upload); also how long a connection is kept for its answers after its framing broke.
  const requestTimeoutMs = Math.max(config.REQUEST_TIMEOUT_MS, config.BULK_UPLOAD_TIMEOUT_MS) + 1000;
  const adapter = new FastifyAdapter({
    bodyLimit: BODY_LIMIT_BYTES,
    // The deadline (REQUEST_TIMEOUT_MS) from routing to answer, body upload included: the filter
    // answers 408 if the client was still sending, else 503. Node's own limits catch what never
    // reaches the router (headers trickling in) and sockets held past any answer.
    handlerTimeout: config.REQUEST_TIMEOUT_MS,
    requestTimeout: requestTimeoutMs,
    connectionTimeout: 2 * config.REQUEST_TIMEOUT_MS,
    // Node checks requestTimeout and headersTimeout only every connectionsCheckingInterval (30 s by default).
    // Node answers an HTTP/1.1 request without Host with a bare 400 and no body; the onRequest
    // hook below refuses it in the error format instead.
    http: { headersTimeout: config.REQUEST_TIMEOUT_MS, connectionsCheckingInterval: 1000, requireHostHeader: false },
    loggerInstance: pino,
    // request-log.ts writes one line per request, with the route, the user and the error code.
    logController: new LogController({ disableRequestLogging: true }),
    // Fastify would take any x-request-id verbatim (8 KB, markup) into every answer and log line.
    requestIdHeader: false,
    genReqId: requestIdOf,
    routerOptions: { maxParamLength: 512, querystringParser: parseQueryString },
    // JSON bodies go through json-body.ts; these keep Fastify's own checks of them out of the way too.
    onProtoPoisoning: 'ignore',
    onConstructorPoisoning: 'ignore',
    clientErrorHandler: (err: Error & { code?: string }, socket: Socket) => clientErrorHandler(err, socket, unread, pino, requestTimeoutMs),
    // Fastify's own refusal of a request arriving while it closes (on a kept-alive connection, or
    // headers completed after the signal) has a body of its own, no X-Request-Id or Retry-After,
    // and a log line of its own: the onRequest hook below refuses it in the error format instead.
    return503OnClosing: false,
    // The router's own refusals (bad percent-encoding, a path parameter over 512 characters) are
    // malformed paths: answered like every other validation error (request id, language, log line),
    // though they come before the hooks that do that for routed requests.
    frameworkErrors: (err: FastifyError, req: FastifyRequest, reply: FastifyReply) => {
      void reply.header('x-request-id', req.id);
      sendError(req, reply, validationFailed({ path: [err.message] }, 'Malformed request path'));
      onResponse(req, reply);
    },
  });
  const app = await NestFactory.create<NestFastifyApplication>(AppModule.forRoot(config, extraModules, stopping), adapter, {
    logger: new PinoNestLogger(pino),
    bufferLogs: false,
    // JSON only (Fastify's own parser), so a form or plain-text body is 415 like any other type,
    // not a body of odd fields: Nest would add a urlencoded parser, and Fastify has a text/plain one.
    bodyParser: false,
    // A failure while the modules start (a database lost after the migrations) is thrown to the caller, whose message
    // names the host; by default Nest logs it with a stack and exits on its own.
    abortOnError: false,
  });
  app.useGlobalPipes(new StrictValidationPipe());
  app.useGlobalGuards(new UndeclaredInputGuard());
  app.useGlobalFilters(new HttpExceptionFilter());
  if (config.CORS_ORIGINS !== undefined) allowBrowserOrigins(app, config.CORS_ORIGINS);

  const fastify = app.getHttpAdapter().getInstance();
  fastify.removeContentTypeParser('text/plain');
  strictJsonBodies(fastify);
  acceptIssuanceUploads(fastify, config.BULK_UPLOAD_TIMEOUT_MS);
  giveLineCsvsTime(fastify, config.BULK_UPLOAD_TIMEOUT_MS);
  servePublicReadsFromMemory(fastify, app.get(CouponService));
  answerGrabsAheadOfNest(fastify, app.get(GrabService), config);
  answerAheadOfFastify(
    fastify.server,
    { isClosing: () => unread.isClosing(), isStopping: () => unread.isStopping(), cors: config.CORS_ORIGINS !== undefined, log: pino },
    [publicReadsAheadOfFastify(app.get(CouponService)), grabsAheadOfFastify(app.get(GrabService), config), ...extraAheadRoutes],
  );
  // Node hands a CONNECT (a proxy's method) to 'connect' listeners and closes the socket unanswered
  // without one; this service is no proxy, so it is a route that does not exist.
  fastify.server.on('connect', (req: IncomingMessage, socket: Socket) => {
    // Node takes its own handlers off a socket it hands over: without this one, a client resetting
    // the connection under the answer would be an uncaught error, and the end of the process.
    socket.on('error', () => socket.destroy());
    answerUnrouted(socket, pino, requestIdOf(req), 404, 'NOT_FOUND', 'Route not found', req.method);
  });
  // Node answers an Expect other than 100-continue with a bare 417 unless this is listened for. A
  // server may also ignore the expectation (RFC 9110, 10.1.1): the request is served as without it.
  fastify.server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => fastify.server.emit('request', req, res));
  continueWhenBodyRead(fastify.server);
  // Callback hooks: an async hook costs every request two more promises.
  fastify.addHook('onRequest', (req, reply, done) => {
    const badHost = hostProblem(req.raw);
    // Connection: close comes with every answer once the server is closing (unread.settle).
    if (unread.isClosing()) {
      done(shuttingDown());
    } else if (req.raw.httpVersion === '1.1' && req.headers.host === undefined) {
      done(validationFailed({ host: ['an HTTP/1.1 request needs a Host header'] }));
    } else if (badHost !== null) {
      done(validationFailed({ host: [`Host ${badHost}`] }, 'The Host header is not valid'));
    } else if (isMalformedQuery(req.query)) {
      done(
        validationFailed(
          { query: ['has a %-escape that is not UTF-8 text or not two hex digits'] },
          'The query string is not valid percent-encoding',
        ),
      );
    } else {
      done();
    }
  });
  fastify.addHook('onSend', (req, reply, payload, done) => {
    void reply.header('x-request-id', req.id);
    unread.settle(req, reply, req.routeOptions.handlerTimeout || config.REQUEST_TIMEOUT_MS);
    done(null, payload);
  });
  fastify.addHook('preClose', (done) => {
    // From here, not from the signal: while Nest's shutdown hooks run (jobs finishing a batch) the
    // server still serves keep-alive connections as usual. The server closes the connections idle
    // when it starts closing, not those that become idle once their request in flight is answered;
    // without this they would hold the close up for the keep-alive timeout (72 s).
    const idle = setInterval(() => fastify.server.closeIdleConnections(), 100).unref();
    fastify.server.once('close', () => clearInterval(idle));
    unread.close();
    done();
  });
  // The deadline counts from routing (reply.elapsedTime), body upload included.
  const deadlines = new WeakMap<FastifyRequest, Deadline>();
  fastify.addHook('preHandler', (req, reply, done) => {
    const deadline = deadlineOf(req.routeOptions.handlerTimeout || config.REQUEST_TIMEOUT_MS, reply.elapsedTime);
    deadlines.set(req, deadline);
    withDeadline(deadline, done);
  });
  fastify.addHook('onResponse', (req, reply, done) => {
    const deadline = deadlines.get(req);
    if (deadline) settleDeadline(deadline, reply.statusCode);
    onResponse(req, reply);
    done();
  });

  if (config.DOCS_ENABLED) SwaggerModule.setup('docs', app, buildOpenApiDocument(app), { jsonDocumentUrl: 'docs-json', raw: ['json'] });
  await serveConsole(app);
  return app;
}
