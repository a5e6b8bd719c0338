import { createServer, IncomingMessage, Server, ServerResponse } from 'node:http';
import { Webhook } from 'standardwebhooks';

export interface Received {
  webhookId: string;
  /** 1 for the first time this webhook-id arrived, 2 for its first repeat, ... */
  attempt: number;
  event: { id: string; type: string; timestamp: string; data: Record<string, unknown> & { userCoupon: Record<string, string | null> } };
  headers: Record<string, string | string[] | undefined>;
  at: number;
  status: number;
}

/** What to answer: a status, 'hang' to never answer, or 'trickle' to send 200 and then a byte every 300 ms, never ending. */
export type Answer = number | 'hang' | 'trickle';

/**
 * A webhook receiver on loopback that verifies every request's Standard Webhooks signature with the
 * endpoint's secret (set `secret` once the endpoint is created). Requests that fail verification are
 * answered 400 and counted in `badSignatures`; the others are recorded with the answer given.
 */
export class WebhookReceiver {
  secret: string | undefined;
  answer: (r: Omit<Received, 'status'>) => Answer | Promise<Answer> = () => 200;
  readonly received: Received[] = [];
  badSignatures = 0;
  private server: Server | undefined;
  private readonly seen = new Map<string, number>();
  private readonly hanging = new Set<ServerResponse>();
  url = '';

  async start(): Promise<this> {
    this.server = createServer((req, res) => void this.handle(req, res));
    this.server.keepAliveTimeout = 30_000;
    await new Promise<void>((ok) => this.server?.listen(0, '127.0.0.1', ok));
    this.url = `http://127.0.0.1:${(this.server.address() as { port: number }).port}/hook`;
    return this;
  }

  /** Closes the connections open to it, kept alive or not: the next delivery has to connect again. */
  dropConnections(): void {
    this.server?.closeAllConnections();
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks).toString('utf8');
    let event: Received['event'];
    try {
      event = new Webhook(this.secret ?? 'whsec_AAAA').verify(body, req.headers as Record<string, string>) as Received['event'];
    } catch {
      this.badSignatures++;
      res.writeHead(400).end();
      return;
    }
    const webhookId = String(req.headers['webhook-id']);
    const attempt = (this.seen.get(webhookId) ?? 0) + 1;
    this.seen.set(webhookId, attempt);
    const r = { webhookId, attempt, event, headers: req.headers, at: Date.now() };
    const answer = await this.answer(r);
    if (answer === 'hang' || answer === 'trickle') {
      this.hanging.add(res);
      if (answer === 'trickle') {
        res.writeHead(200);
        const timer = setInterval(() => res.write(' '), 300);
        res.once('close', () => clearInterval(timer));
      }
      return;
    }
    this.received.push({ ...r, status: answer });
    res.writeHead(answer).end();
  }

  /** The events answered 2xx, in the order they were accepted. */
  get accepted(): Received[] {
    return this.received.filter((r) => r.status >= 200 && r.status < 300);
  }

  async waitFor(predicate: () => boolean, timeoutMs = 30_000, what = 'webhook deliveries'): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${this.accepted.length} accepted so far`);
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  async close(): Promise<void> {
    for (const res of this.hanging) res.destroy();
    this.server?.closeAllConnections();
    await new Promise<void>((ok) => (this.server ? this.server.close(() => ok()) : ok()));
  }
}
