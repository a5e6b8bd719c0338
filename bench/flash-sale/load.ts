import http from 'node:http';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';

export interface Shot {
  userId: string;
  key: string;
  /** Pre-signed before the timed part: signing is the client's cost, not the server's. */
  authorization: string;
}

export interface Answer {
  shot: number;
  status: number;
  /** `code` of an error body; TRANSPORT_ERROR when no HTTP answer came back. */
  code: string | null;
  /** `id` of a 2xx body. */
  id: string | null;
  latencyMs: number;
  /** When the answer was complete, in ms since the first request was sent. */
  doneAtMs: number;
}

export interface LoadResult {
  answers: Answer[];
  wallMs: number;
  /** Distinct TCP connections the requests travelled on. */
  connectionsUsed: number;
  /** The most requests that were in flight at the same moment. */
  maxInFlight: number;
}

/**
 * A closed-loop load generator over node:http: `connections` keep-alive sockets, each sending its
 * next request as soon as the previous answer is read, until every shot is fired. Latency is from
 * writing the request to reading the last byte of the answer, so it never includes time a request
 * waited in the client for a free socket.
 */
export class LoadGenerator {
  private readonly agent: http.Agent;

  constructor(
    private readonly baseUrl: string,
    readonly connections: number,
    private readonly timeoutMs = 60_000,
  ) {
    this.agent = new http.Agent({ keepAlive: true, maxSockets: connections, maxFreeSockets: connections, scheduling: 'fifo' });
  }

  async fire(path: string, shots: readonly Shot[]): Promise<LoadResult> {
    const url = new URL(path, this.baseUrl);
    const answers: Answer[] = new Array(shots.length);
    const usedBefore = new Set<Socket>();
    let next = 0;
    let inFlight = 0;
    let maxInFlight = 0;
    const t0 = performance.now();
    const worker = async () => {
      while (next < shots.length) {
        const i = next++;
        inFlight++;
        maxInFlight = Math.max(maxInFlight, inFlight);
        const started = performance.now();
        const res = await this.send(url, shots[i], usedBefore);
        const done = performance.now();
        inFlight--;
        answers[i] = { shot: i, ...res, latencyMs: done - started, doneAtMs: done - t0 };
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.connections, shots.length) }, worker));
    return { answers, wallMs: performance.now() - t0, connectionsUsed: usedBefore.size, maxInFlight };
  }

  close(): void {
    this.agent.destroy();
  }

  private send(url: URL, shot: Shot, used: Set<Socket>): Promise<Pick<Answer, 'status' | 'code' | 'id'>> {
    return new Promise((resolve) => {
      const req = http.request(
        {
          agent: this.agent,
          host: url.hostname,
          port: url.port,
          path: url.pathname,
          method: 'POST',
          headers: { authorization: shot.authorization, 'idempotency-key': shot.key, 'content-length': '0' },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('error', (err) => resolve({ status: 0, code: `TRANSPORT_ERROR:${err.message}`, id: null }));
          res.on('end', () => {
            const status = res.statusCode ?? 0;
            let body: { id?: unknown; code?: unknown } = {};
            try {
              body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as typeof body;
            } catch {
              // A body that is not JSON is still an answer; its status says what it was.
            }
            resolve({
              status,
              code: status >= 200 && status < 300 ? null : typeof body.code === 'string' ? body.code : `HTTP_${status}`,
              id: typeof body.id === 'string' ? body.id : null,
            });
          });
        },
      );
      req.on('socket', (s: Socket) => used.add(s));
      req.setTimeout(this.timeoutMs, () => req.destroy(new Error(`no answer within ${this.timeoutMs} ms`)));
      req.on('error', (err) => resolve({ status: 0, code: `TRANSPORT_ERROR:${err.message}`, id: null }));
      req.end();
    });
  }
}
