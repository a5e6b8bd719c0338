import type { Socket } from 'node:net';
import type { FastifyReply, FastifyRequest } from 'fastify';

/** The most of a refused body read and dropped: the largest body any route takes (a bulk upload's CSV). */
export const DRAIN_MAX_BYTES = 64 * 1024 * 1024;

const draining = new WeakSet<Socket>();

/** The socket carries the rest of a body whose answer went: a client error on it (bad chunk framing) gets no answer of its own. */
export const isDraining = (socket: Socket) => draining.has(socket);

/**
 * An answer sent before the body was read (413 on its length, 415 for another type, 401 for a
 * bulk upload without a token) reads and drops the rest of the body, up to DRAIN_MAX_BYTES, and
 * keeps the connection. Closing it instead (Fastify closes it after any body it could not parse)
 * made a client still sending see EPIPE or a reset rather than the answer: Python's http.client
 * 5 of 5 times for a 4 MB body to POST /admin/coupons, Node fetch 11 of 20 for a 4 MiB text/plain
 * one to the bulk route. And Node does not drain a body it has started on: the next request on a
 * kept-alive connection waited for the request timeout behind it. The rest must arrive within
 * `withinMs` (the route's deadline) of the answer, else the connection is closed.
 *
 * A body still being read (an upload cut off by its deadline), one longer than DRAIN_MAX_BYTES, or
 * a 408 closes the connection after the answer. Its reader must then hear of the close: Node ends
 * no body whose answer has gone, so the reader waited forever (a bulk upload's heartbeat kept it
 * alive and its Idempotency-Key taken for good). Destroyed without an error, which a stream reader
 * hears as a premature close: Fastify's own JSON reader answers an error with a second reply, and
 * logged a warning for every JSON body cut off by its deadline.
 */
export function settleUnreadBody(req: FastifyRequest, reply: FastifyReply, withinMs: number): void {
  const body = req.raw;
  if (body.complete) return;
  const reading = body.listenerCount('data') + body.listenerCount('readable') > 0;
  if (body.destroyed || reading || reply.statusCode === 408 || Number(req.headers['content-length']) > DRAIN_MAX_BYTES) {
    void reply.header('Connection', 'close');
    body.socket?.once('close', () => {
      if (!body.complete) body.destroy();
    });
    return;
  }
  reply.removeHeader('connection');
  let dropped = 0;
  body.on('data', (chunk: Buffer) => {
    dropped += chunk.length;
    if (dropped > DRAIN_MAX_BYTES) body.destroy();
  });
  // As long again as the route gives a request to arrive: else a client trickling the rest held the
  // connection for Node's requestTimeout (601 s), where a slow body that is not refused gets 10 s.
  const giveUp = setTimeout(() => body.destroy(), withinMs).unref();
  const socket = body.socket;
  draining.add(socket);
  const done = () => {
    clearTimeout(giveUp);
    draining.delete(socket);
  };
  body.once('end', done).once('close', done);
  body.resume();
}
