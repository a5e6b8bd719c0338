import { Agent, IncomingHttpHeaders, request } from 'node:http';
import { afterAll } from '@jest/globals';
import { ContractLog } from '../../support/harness.js';

/** The fields of the API's bodies the fault tests look at. */
export interface Body {
  id?: string;
  code?: string;
  message?: string;
  userId?: string;
  couponId?: string;
  status?: string;
  source?: string;
  redemptionId?: string;
  firstUse?: boolean;
  runId?: string;
  remainingStock?: number;
  replacementUserCoupon?: { id: string } | null;
  [field: string]: unknown;
}

export interface Reply {
  /** 0 when no answer came: connection refused or reset, or the timeout. */
  status: number;
  body: Body;
  headers: IncomingHttpHeaders;
  error?: string;
  /** Wall clock (Date.now()) when the request was sent. */
  sentAt: number;
  /** From sending to the end of the answer (or its loss). */
  ms: number;
}

export interface CallOptions {
  token?: string;
  headers?: Record<string, string>;
  body?: unknown;
  timeoutMs?: number;
}

const agent = new Agent({ keepAlive: true });

/**
 * The servers of the fault suite run outside the harness, so their answers are checked here, as
 * they arrive: every answer of every fault test against docs/openapi.json, and the test file fails
 * at its end naming each mismatch. Registered when a test file imports this client.
 */
const contract = new ContractLog();
afterAll(() => contract.finish());

/** Checks an answer the fault suite received (`text` is its body as sent); lost answers (status 0) have nothing to check. */
export function checkReply(method: string, path: string, reply: Reply, text: string, requestBody?: unknown): void {
  if (reply.status === 0) return;
  const route = contract.checker.routeOf(method, path);
  contract.check({ method, route, status: reply.status, headers: reply.headers, body: text, requestBody }, `${method} ${route ?? path}`);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** One HTTP call that never throws: a lost answer is status 0 with the reason, as a client would see it. */
export function call(base: string, method: string, path: string, opts: CallOptions = {}): Promise<Reply> {
  const url = new URL(path, base);
  const payload = opts.body === undefined ? undefined : JSON.stringify(opts.body);
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  if (payload !== undefined) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(Buffer.byteLength(payload));
  }
  const sentAt = Date.now();
  const started = performance.now();
  const elapsed = () => Math.round(performance.now() - started);
  return new Promise((resolve) => {
    const lost = (error: string) => resolve({ status: 0, body: {}, headers: {}, error, sentAt, ms: elapsed() });
    const req = request(
      { host: url.hostname, port: url.port, path: url.pathname + url.search, method, headers, agent, timeout: opts.timeoutMs ?? 60_000 },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', (e) => lost(e.message));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let body: Body;
          try {
            body = text ? (JSON.parse(text) as Body) : {};
          } catch {
            body = { text };
          }
          const reply = { status: res.statusCode ?? 0, body, headers: res.headers, sentAt, ms: elapsed() };
          checkReply(method, url.pathname, reply, text, opts.body);
          resolve(reply);
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error('client timeout')));
    req.on('error', (e: NodeJS.ErrnoException) => lost(e.code ?? e.message));
    req.end(payload);
  });
}

/** For reads after a fault: a pooled socket to a dead process may fail once before a fresh one is used. */
export async function callUntilAnswered(base: string, method: string, path: string, opts: CallOptions = {}, attempts = 20): Promise<Reply> {
  let last: Reply = { status: 0, body: {}, headers: {}, error: 'not tried', sentAt: Date.now(), ms: 0 };
  for (let i = 0; i < attempts; i++) {
    last = await call(base, method, path, opts);
    if (last.status !== 0 && last.status !== 503) return last;
    await sleep(100 * (i + 1));
  }
  return last;
}

/**
 * `fn` over `items`, at most `limit` at a time, each worker taking the next item once its own is
 * done. With `stopped`, no item is started once it holds (a flood cut by a crash); the results are
 * those of the items started, in item order.
 */
export async function mapConcurrent<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number) => Promise<R>,
  stopped: () => boolean = () => false,
): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length && !stopped()) {
      const i = next++;
      results[i] = await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results.slice(0, next);
}

/** The p-quantile (0..1) of the replies' latencies in ms. */
export function percentile(replies: readonly Reply[], p: number): number {
  const sorted = replies.map((r) => r.ms).sort((a, b) => a - b);
  return sorted[Math.floor(p * (sorted.length - 1))] ?? 0;
}
