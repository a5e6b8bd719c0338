import type { IncomingMessage } from 'node:http';
import { Socket } from 'node:net';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { awaitsContinue, forgoContinue } from './expect-continue.js';
import { announcesBody } from './validation.js';

/** The most of a refused body read and dropped: the largest body any route takes (a bulk upload's CSV). */
const DRAIN_MAX_BYTES = 64 * 1024 * 1024;
/** How long a connection answered without 100 Continue is read from after its answer. */
const LINGER_MS = 2000;

/**
 * Bodies whose answer went before they had all arrived, one set per server. An answer sent before
 * the body was read (413 on its length, 415 for another type, 401 for a bulk upload without a
 * token) reads and drops the rest, up to DRAIN_MAX_BYTES, and keeps the connection. Closing it
 * instead (Fastify closes it after any body it could not parse) made a client still sending see
 * EPIPE or a reset rather than the answer: Python's http.client 5 of 5 times for a 4 MB body to
 * POST /admin/coupons, Node fetch 11 of 20 for a 4 MiB text/plain one to the bulk route. And Node
 * does not drain a body it has started on: the next request on a kept-alive connection waited for
 * the request timeout behind it. The rest must arrive within the route's deadline of the answer.
 *
 * A connection the client asked to close (`Connection: close`, HTTP/1.0) is closed once the rest
 * has arrived, not right after the answer: Node destroys it then, and the rest still arriving was
 * answered with a reset that took the answer with it (4 curl loops at once lost 282 of 680). Its
 * write side is ended with the answer, as Node would; the server's sockets are half-open, so the
 * read side drains. A body still being read (an upload cut off by its deadline), one longer than
 * DRAIN_MAX_BYTES, a 408, or a server shutting down closes the connection after the answer.
 *
 * A body's reader must hear when its connection closes: Node ends no body whose answer has gone,
 * so the reader waited forever (a bulk upload's heartbeat kept it alive and its Idempotency-Key
 * taken for good). Destroyed without an error, which a stream reader hears as a premature close:
 * Fastify's own JSON reader answers an error with a second reply, and logged a warning for every
 * JSON body cut off by its deadline.
 */
export class UnreadBodies {
  private readonly draining = new Map<Socket, IncomingMessage>();
  private closing = false;

  /** `stopping`: the instance drains before it stops (Stopping), and every answer closes its connection. */
  constructor(private readonly stopping: () => boolean) {}

  /** The socket carries the rest of a body whose answer went: a client error on it (bad chunk framing) gets no answer of its own. */
  isDraining(socket: Socket): boolean {
    return this.draining.has(socket);
  }

  /** In onSend: keeps or closes the connection of an answer whose body has not all arrived, or of any answer once the instance is stopping. */
  settle(req: FastifyRequest, reply: FastifyReply, withinMs: number): void {
    // A client that reused the connection would have its next request reset, unanswered, when the
    // closing server closes it a moment later.
    const stopping = this.isStopping();
    if (stopping) void reply.header('connection', 'close');
    const body = req.raw;
    // Arrived whole before anything read it (so nothing asked for it): the 100 goes late, before the
    // answer, or Node would close a connection that has nothing left to read.
    if (body.complete && awaitsContinue(body)) {
      forgoContinue(body);
      reply.raw.writeContinue();
    }
    // Not `complete` yet either when answered in the turn it arrived (the coupon page from memory, a
    // 404), before Node's parser has ended it: a listener added then stayed until the connection closed.
    if (body.complete || !announcesBody(req)) return;
    const socket = body.socket;
    const onClose = () => {
      if (!body.complete) body.destroy();
    };
    socket.once('close', onClose);
    const reading = body.listenerCount('data') + body.listenerCount('readable') > 0;
    if (this.closing || body.destroyed || reading || reply.statusCode === 408 || Number(req.headers['content-length']) > DRAIN_MAX_BYTES) {
      void reply.header('connection', 'close');
      return;
    }
    // Not asked for its body: a client that waits for the 100 sends none, one that did not wait
    // (or stopped waiting) may be sending it. Closed, but its write side only (lingering): what
    // still arrives is read and dropped, so such a client reads the answer instead of a reset.
    const held = awaitsContinue(body);
    if (held) forgoContinue(body);
    const keepAlive = reply.raw.shouldKeepAlive && !held && !stopping;
    void reply.header('connection', keepAlive ? 'keep-alive' : 'close');
    // Node ends an answer with Connection: close by socket.destroySoon(): here only the write side ends.
    if (!keepAlive) socket.destroySoon = () => socket.end();
    let dropped = 0;
    body.on('data', (chunk: Buffer) => {
      dropped += chunk.length;
      if (dropped > DRAIN_MAX_BYTES) body.destroy();
    });
    // Else a client trickling the rest held the connection for Node's requestTimeout (601 s), where
    // a slow body that is not refused gets the route's deadline.
    const giveUp = setTimeout(() => body.destroy(), held ? Math.min(withinMs, LINGER_MS) : withinMs).unref();
    this.draining.set(socket, body);
    const done = () => {
      clearTimeout(giveUp);
      this.draining.delete(socket);
      // A kept-alive connection carries many bodies: each one's listener goes with it.
      socket.off('close', onClose);
      if (keepAlive) return;
      // Closed as Node would have, once the answer is out: all of the body is in, so nothing arrives to be reset.
      const close = () => Socket.prototype.destroySoon.call(socket);
      if (reply.raw.writableFinished) close();
      else reply.raw.once('finish', close);
    };
    body.once('end', done).once('close', done);
    body.resume();
  }

  /** From the signal on: draining, then closing. */
  isStopping(): boolean {
    return this.closing || this.stopping();
  }

  /** From the server's preClose on: a request that arrives then is refused (app.factory.ts). */
  isClosing(): boolean {
    return this.closing;
  }

  /** The server is closing: what is still arriving is dropped with its connection, which would otherwise hold the close up to the route's deadline. */
  close(): void {
    this.closing = true;
    for (const body of this.draining.values()) body.destroy();
  }
}
