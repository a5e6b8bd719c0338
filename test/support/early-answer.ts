import { Agent, OutgoingHttpHeaders, request as httpRequest } from 'node:http';
import type { Socket } from 'node:net';

/** What a client still sending its body saw: the answer, whether all of the body went up, and on which connection. */
export interface EarlyAnswer {
  status: number;
  connection?: string;
  body: string;
  sentAll: boolean;
  socket: Socket | null;
}

/**
 * One request on `agent`'s connection: `body` written in 64 KiB chunks, without a length when
 * `chunked`, until written or the server closes the connection under it; settled once both the
 * answer and the writing are done.
 */
export const sendOnAgent = (
  agent: Agent,
  method: string,
  url: string,
  headers: OutgoingHttpHeaders,
  body: string | Buffer,
  chunked: boolean,
) =>
  new Promise<EarlyAnswer>((resolve, reject) => {
    const req = httpRequest(url, {
      method,
      agent,
      headers: { ...headers, ...(chunked ? { 'Transfer-Encoding': 'chunked' } : { 'Content-Length': Buffer.byteLength(body) }) },
    });
    let answer: { status: number; connection?: string; body: string } | undefined;
    let sentAll: boolean | undefined;
    let answered = () => {};
    const settle = () => {
      if (answer && sentAll !== undefined) resolve({ ...answer, sentAll, socket: req.socket });
    };
    req.on('response', (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => {
        answer = { status: res.statusCode ?? 0, connection: res.headers.connection, body: text };
        answered();
        settle();
      });
    });
    req.on('error', (err) => {
      if (!answer) reject(err);
    });
    void (async () => {
      for (let i = 0; i < body.length && !req.destroyed; i += 64 * 1024) {
        // Node's client stops passing 'drain' on once the answer is complete: then it just writes on.
        const piece = typeof body === 'string' ? body.slice(i, i + 64 * 1024) : body.subarray(i, i + 64 * 1024);
        if (!req.write(piece) && !answer)
          await new Promise<void>((r) => {
            req.once('drain', r);
            answered = r;
          });
        await new Promise((r) => setImmediate(r));
      }
      sentAll = !req.destroyed;
      if (sentAll) req.end();
      settle();
    })();
  });

/** GET /health on `agent`'s connection, and the socket it went on. */
export const healthOnAgent = (agent: Agent, baseUrl: string) =>
  new Promise<{ status: number; socket: Socket }>((resolve, reject) => {
    const req = httpRequest(`${baseUrl}/health`, { agent, timeout: 5000 }, (res) => {
      res.resume();
      resolve({ status: res.statusCode ?? 0, socket: res.socket });
    });
    req.on('timeout', () => req.destroy(new Error('no answer: the connection is still behind the unread body')));
    req.on('error', reject);
    req.end();
  });
