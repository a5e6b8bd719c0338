import { request } from 'node:http';
import { adminToken } from '../../support/harness.js';
import { callUntilAnswered, checkReply, Reply } from './http.js';

/** `n` user ids, one per line, as an operator's export would have them: `prefix0` .. `prefix<n-1>`. */
export function userIdCsv(prefix: string, n: number, extraLines: readonly string[] = []): Buffer {
  const lines = Array.from({ length: n }, (_, i) => `${prefix}${i}`);
  return Buffer.from(`user_id\n${[...lines, ...extraLines].join('\n')}\n`);
}

/** POST of a text/csv list to the bulk issuance route, sent as one body. */
export function uploadCsv(base: string, couponId: string, csv: Buffer, key: string, query = 'reason=fault&fromStock=true'): Promise<Reply> {
  const url = new URL(`/admin/coupons/${couponId}/issuances?${query}`, base);
  const sentAt = Date.now();
  const started = performance.now();
  return new Promise((resolve) => {
    const req = request(
      {
        host: url.hostname,
        port: url.port,
        path: url.pathname + url.search,
        method: 'POST',
        headers: {
          authorization: `Bearer ${adminToken()}`,
          'idempotency-key': key,
          'content-type': 'text/csv',
          'content-length': String(csv.length),
        },
        timeout: 600_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          const reply = {
            status: res.statusCode ?? 0,
            body: text ? JSON.parse(text) : {},
            headers: res.headers,
            sentAt,
            ms: Math.round(performance.now() - started),
          };
          checkReply('POST', url.pathname, reply, text);
          resolve(reply);
        });
      },
    );
    req.on('error', (e: NodeJS.ErrnoException) =>
      resolve({ status: 0, body: {}, headers: {}, error: e.code ?? e.message, sentAt, ms: Math.round(performance.now() - started) }),
    );
    req.end(csv);
  });
}

export interface JobView {
  id: string;
  status: string;
  total: number;
  issued: number;
  skipped: number;
  skippedByReason: Record<string, number>;
}

export async function jobOf(base: string, jobId: string): Promise<JobView> {
  const r = await callUntilAnswered(base, 'GET', `/admin/issuance-jobs/${jobId}`, { token: adminToken() });
  if (r.status !== 200) throw new Error(`GET job ${jobId}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body as unknown as JobView;
}
