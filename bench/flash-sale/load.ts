import { performance } from 'node:perf_hooks';
import { gunzipSync } from 'node:zlib';
import { Client } from 'undici';

/** A read's `id`: a Coupon's own, or a page's first coupon's. */
const READ_ID = /^\{(?:"items":\[\{)?"id":"([^"]+)"/;

/** What Chromium sends; the public list is large enough to be answered gzip'd. */
export const BROWSER_ACCEPT_ENCODING = 'gzip, deflate, br, zstd';

export interface Shot {
  userId: string;
  /** Sent as Idempotency-Key when given. */
  key?: string;
  /** Pre-signed before the timed part: signing is the client's cost, not the server's. */
  authorization: string;
  /** A JSON body, serialised before the timed part for the same reason. */
  body?: string;
  /** This shot's route, when a burst mixes routes (a checkout's confirmations and releases). */
  path?: string;
  /**
   * This shot's method, when a burst mixes reads and writes (a sale's mixed load). A GET named here
   * carries the shot's token unless it is ''; a GET of the whole burst is anonymous.
   */
  method?: 'GET' | 'POST';
}

export interface Answer {
  shot: number;
  status: number;
  /** `code` of an error body; TRANSPORT_ERROR when no HTTP answer came back. */
  code: string | null;
  /** `id` of a 2xx body (a Hold's `holdId`, a Redemption's `redemptionId`, a list page's first coupon's). */
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
 * A closed-loop load generator: `connections` workers, each with its own keep-alive connection
 * (an undici Client), sending its next request as soon as the previous answer is read, until every
 * shot is fired. undici rather than node:http because the generator shares the machine's cores with
 * the server and the database: node:http cost about 0.13 ms of CPU per request, undici a fraction of
 * it, so the server under test gets the CPU. Latency is from sending the request to reading the last
 * byte of the answer, so it never includes time a request waited in the client for a free connection.
 */
export class LoadGenerator {
  private readonly clients: Client[] = [];
  /** How many TCP connections each worker's client has opened so far: (worker, count) names a connection. */
  private readonly opened: number[] = [];
  private lastGzip: { bytes: Buffer; text: string } | undefined;

  constructor(
    private readonly baseUrl: string,
    readonly connections: number,
    private readonly timeoutMs = 60_000,
  ) {}

  async fire(path: string, shots: readonly Shot[], method: 'GET' | 'POST' = 'POST'): Promise<LoadResult> {
    const answers: Answer[] = new Array(shots.length);
    const used = new Set<string>();
    let next = 0;
    let inFlight = 0;
    let maxInFlight = 0;
    const t0 = performance.now();
    const worker = async (w: number) => {
      const client = this.client(w);
      while (next < shots.length) {
        const i = next++;
        inFlight++;
        maxInFlight = Math.max(maxInFlight, inFlight);
        const started = performance.now();
        const res = await this.send(client, shots[i].path ?? path, shots[i], shots[i].method ?? method);
        const done = performance.now();
        used.add(`${w}:${this.opened[w]}`);
        inFlight--;
        answers[i] = { shot: i, ...res, latencyMs: done - started, doneAtMs: done - t0 };
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.connections, shots.length) }, (_, w) => worker(w)));
    return { answers, wallMs: performance.now() - t0, connectionsUsed: used.size, maxInFlight };
  }

  async close(): Promise<void> {
    await Promise.all(this.clients.map((c) => c.destroy()));
  }

  /**
   * The text of a gzip'd answer. A read served from the server's memory repeats its bytes until the
   * stock moves; decoding each copy again cost this generator, which shares the server's cores, 22 µs
   * an answer (a list page: 449 bytes to 7 KB), a fifth of what the server spent answering it.
   */
  private gunzipped(bytes: Buffer): string {
    if (this.lastGzip === undefined || !this.lastGzip.bytes.equals(bytes)) this.lastGzip = { bytes, text: gunzipSync(bytes).toString() };
    return this.lastGzip.text;
  }

  /** Worker w's client, made on first use. */
  private client(w: number): Client {
    if (!this.clients[w]) {
      const c = new Client(this.baseUrl, { pipelining: 1, headersTimeout: this.timeoutMs, bodyTimeout: this.timeoutMs });
      this.opened[w] = 0;
      c.on('connect', () => this.opened[w]++);
      this.clients[w] = c;
    }
    return this.clients[w];
  }

  private async send(client: Client, path: string, shot: Shot, method: 'GET' | 'POST'): Promise<Pick<Answer, 'status' | 'code' | 'id'>> {
    try {
      const res = await client.request(
        method === 'GET'
          ? // A shopper's read, asking for gzip as every browser does: anonymous unless the shot itself is a
            // signed-in read ("my coupons").
            {
              path,
              method,
              headers: {
                'accept-encoding': BROWSER_ACCEPT_ENCODING,
                ...(shot.method === 'GET' && shot.authorization !== '' ? { authorization: shot.authorization } : {}),
              },
            }
          : {
              path,
              method,
              headers: {
                authorization: shot.authorization,
                ...(shot.key === undefined ? {} : { 'idempotency-key': shot.key }),
                ...(shot.body === undefined ? { 'content-length': '0' } : { 'content-type': 'application/json' }),
              },
              body: shot.body,
            },
      );
      const status = res.statusCode;
      // A gzip'd answer is decoded as the browser would; undici's request does not.
      const text =
        res.headers['content-encoding'] === 'gzip' ? this.gunzipped(Buffer.from(await res.body.arrayBuffer())) : await res.body.text();
      // A read's answer (a page of 20 coupons is 8 KB of JSON) is not parsed: parsing it cost the shared CPU
      // more than the server spent answering it. A Coupon body starts with its id, a page with its first coupon's.
      if (method === 'GET' && status === 200) return { status, code: null, id: READ_ID.exec(text)?.[1] ?? null };
      let body: { id?: unknown; holdId?: unknown; redemptionId?: unknown; code?: unknown } = {};
      try {
        body = JSON.parse(text) as typeof body;
      } catch {
        // A body that is not JSON is still an answer; its status says what it was.
      }
      return {
        status,
        code: status >= 200 && status < 300 ? null : typeof body.code === 'string' ? body.code : `HTTP_${status}`,
        id: [body.id, body.holdId, body.redemptionId].find((x): x is string => typeof x === 'string') ?? null,
      };
    } catch (err) {
      return { status: 0, code: `TRANSPORT_ERROR:${(err as Error).message}`, id: null };
    }
  }
}
