// npm run bench:webhooks [-- --events 10000 --grabs 10000 --stock 5000 --connections 1000]
// The webhook relay: throughput to a local receiver, lag during a flash-sale burst, and the grab
// path's throughput with a webhook subscribed against without. Results go to stdout as markdown.
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';
import { Webhook } from 'standardwebhooks';
import { signToken } from '../src/auth/jwt.js';
import { LoadGenerator, type Shot } from './flash-sale/load.js';
import { createCoupon, dropDatabase, quietServerEnv } from './flash-sale/run-design.js';
import { startServer, type RunningServer } from './flash-sale/server.js';

const { values: opt } = parseArgs({
  options: {
    events: { type: 'string', default: '10000' },
    grabs: { type: 'string', default: '10000' },
    stock: { type: 'string', default: '5000' },
    connections: { type: 'string', default: '1000' },
  },
});
const EVENTS = Number(opt.events);
const GRABS = Number(opt.grabs);
const STOCK = Number(opt.stock);
const CONNECTIONS = Number(opt.connections);
const JWT_SECRET = randomBytes(24).toString('hex');
const admin = `Bearer ${signToken(JWT_SECRET, 'bench-admin', ['admin'], 3600)}`;
const database = `ce_bench_webhooks_${randomBytes(4).toString('hex')}`;

/** Answers 204 at once; records when each webhook-id first arrived; checks one signature in 100 (verifying all would take the relay's CPU). */
class Receiver {
  readonly firstSeen = new Map<string, { at: number; eventAt: number }>();
  posts = 0;
  bad = 0;
  secret = '';
  url = '';
  private readonly server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      this.posts++;
      const id = String(req.headers['webhook-id']);
      const body = Buffer.concat(chunks).toString('utf8');
      if (this.posts % 100 === 1) {
        try {
          new Webhook(this.secret).verify(body, req.headers as Record<string, string>);
        } catch {
          this.bad++;
        }
      }
      if (!this.firstSeen.has(id))
        this.firstSeen.set(id, { at: Date.now(), eventAt: Date.parse((JSON.parse(body) as { timestamp: string }).timestamp) });
      res.writeHead(204).end();
    });
  });

  async start(): Promise<void> {
    await new Promise<void>((ok) => this.server.listen(0, '127.0.0.1', ok));
    this.url = `http://127.0.0.1:${(this.server.address() as { port: number }).port}/hook`;
  }

  async until(n: number, timeoutMs: number): Promise<number> {
    const deadline = Date.now() + timeoutMs;
    while (this.firstSeen.size < n) {
      if (Date.now() > deadline) throw new Error(`receiver got ${this.firstSeen.size} of ${n} events`);
      await new Promise((r) => setTimeout(r, 5));
    }
    return Date.now();
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((ok) => this.server.close(() => ok()));
  }
}

const env = (relay: boolean) => ({
  ...quietServerEnv(database, JWT_SECRET),
  WEBHOOK_RELAY_ENABLED: String(relay),
  LEASE_TTL_MS: '3000',
});
const start = (relay: boolean) => startServer({ entry: 'dist/src/main.js', env: env(relay) });

async function api(server: RunningServer, method: string, path: string, body?: unknown): Promise<Record<string, unknown>> {
  const res = await fetch(`${server.url}${path}`, {
    method,
    headers: { authorization: admin, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return res.status === 204 ? {} : ((await res.json()) as Record<string, unknown>);
}

function shots(n: number, round: string): Shot[] {
  return Array.from({ length: n }, (_, i) => ({
    userId: `${round}-u${i}`,
    key: `${round}-k${i}`,
    authorization: `Bearer ${signToken(JWT_SECRET, `${round}-u${i}`, [], 3600)}`,
  }));
}

async function burst(server: RunningServer, round: string, stock: number, n: number) {
  const couponId = await createCoupon(server.url, admin, stock);
  const load = new LoadGenerator(server.url, CONNECTIONS);
  try {
    const result = await load.fire(`/coupons/${couponId}/grab`, shots(n, round));
    const issued = result.answers.filter((a) => a.status === 201).length;
    if (issued !== Math.min(stock, n)) throw new Error(`${round}: ${issued} grabs succeeded, expected ${Math.min(stock, n)}`);
    return { grabsPerSecond: (n / result.wallMs) * 1000, wallMs: result.wallMs, endedAt: Date.now() };
  } finally {
    await load.close();
  }
}

const quantile = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.floor(q * (xs.length - 1))] ?? 0;
const r0 = (x: number) => Math.round(x);

async function main(): Promise<void> {
  const rx = new Receiver();
  await rx.start();
  const lines: string[] = [];
  try {
    // 1. Throughput: EVENTS issuances committed while no relay runs, then a relay starts on the backlog.
    let server = await start(false);
    const hook = await api(server, 'POST', '/admin/webhooks', { url: rx.url });
    rx.secret = hook.secret as string;
    await burst(server, 'backlog', EVENTS, EVENTS);
    await server.stop();
    server = await start(true);
    const booted = Date.now();
    const cpu0 = server.cpuSeconds();
    const done = await rx.until(EVENTS, 600_000);
    const cpuMs = ((server.cpuSeconds() - cpu0) * 1000) / EVENTS;
    lines.push(
      `| relay throughput: ${EVENTS} events waiting, relay started | ${r0((EVENTS / (done - booted)) * 1000)} events/s (${done - booted} ms from healthy to the last event) |`,
      `| the server's CPU per event in that phase (fan-out, signing, POST, outcome) | ${cpuMs.toFixed(2)} ms, i.e. ${r0(1000 / cpuMs)} events/s per core |`,
    );

    // 2. Grabs without, then with, a webhook subscribed; the second burst's events are timed.
    await api(server, 'PATCH', `/admin/webhooks/${String(hook.id)}`, { enabled: false });
    const without = await burst(server, 'plain', STOCK, GRABS);
    await api(server, 'PATCH', `/admin/webhooks/${String(hook.id)}`, { enabled: true });
    const before = rx.firstSeen.size;
    const withHook = await burst(server, 'hooked', STOCK, GRABS);
    const last = await rx.until(before + STOCK, 600_000);
    const latencies = [...rx.firstSeen.values()].slice(before).map((s) => s.at - s.eventAt);
    lines.push(
      `| grab burst (${GRABS} grabs of ${STOCK}, ${CONNECTIONS} connections), no webhook subscribed | ${r0(without.grabsPerSecond)} grabs/s |`,
      `| the same burst, one webhook subscribed | ${r0(withHook.grabsPerSecond)} grabs/s (${((withHook.grabsPerSecond / without.grabsPerSecond) * 100).toFixed(0)} % of without) |`,
      `| relay lag in that burst: commit to receipt, p50 / p99 / max | ${r0(quantile(latencies, 0.5))} / ${r0(quantile(latencies, 0.99))} / ${r0(Math.max(...latencies))} ms |`,
      `| last event received after the last grab answered | ${last - withHook.endedAt} ms |`,
      `| signatures checked (1 in 100), bad | ${Math.ceil(rx.posts / 100)}, ${rx.bad} |`,
    );
    await server.stop();
  } finally {
    await rx.close();
    await dropDatabase(database);
  }
  console.log(['| measure | result |', '|---|---|', ...lines].join('\n'));
}

await main();
