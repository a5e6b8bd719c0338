import { couponBody } from '../support/factories.js';
import { adminToken, tokenFor } from '../support/harness.js';
import { WebhookReceiver } from '../support/webhook-receiver.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, callUntilAnswered, sleep } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

const GRABS = 1000;

/**
 * Invariant 7 across crashes and instances: every committed state-log row reaches the receiver
 * (at least once, always under the same webhook-id and with the same body), and nothing else does.
 */
describe('webhooks under kill -9 and with three instances', () => {
  let fdb: FaultDatabase;
  let servers: Server[] = [];
  let rx: WebhookReceiver;
  const env = {
    WEBHOOK_RELAY_ENABLED: 'true',
    WEBHOOK_POLL_MS: '50',
    WEBHOOK_RETRY_DELAYS: '1,1,1,1,1,1,1,1,1,1',
    // Renewals share the pool with a third of the grabs: a lease of 3 s was within reach of a late one.
    LEASE_TTL_MS: '6000',
    DB_POOL_SIZE: '10',
    // A slow stream: the kill lands while events are still going out.
    WEBHOOK_MAX_IN_FLIGHT: '4',
  };
  const figures = { requests: 0, faults: 0, violations: 0, acknowledgedWritesLost: 0, events: 0, repeats: 0, repeatsBeforeKill: 0 };

  beforeAll(async () => {
    await buildServer();
    rx = await new WebhookReceiver().start();
    rx.answer = async () => {
      await sleep(2 + Math.random() * 5);
      return 200;
    };
  });
  beforeEach(async () => {
    fdb = await createFaultDatabase();
    rx.received.length = 0;
  });
  afterEach(async () => {
    await Promise.all(servers.map((s) => s.stop()));
    servers = [];
    await fdb?.close();
  });
  afterAll(async () => {
    report({ scenario: 'webhooks: kill -9 mid-stream, three instances', ...figures });
    await rx?.close();
  });

  const setUp = async (url: string) => {
    const hook = await call(url, 'POST', '/admin/webhooks', { token: adminToken(), body: { url: rx.url } });
    expect(hook.status).toBe(201);
    rx.secret = hook.body.secret as string;
    const coupon = await call(url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: GRABS }) });
    expect(coupon.status).toBe(201);
    return coupon.body.id as string;
  };
  const grabs = (couponId: string, round: string, urls: () => string[]) =>
    Promise.all(
      Array.from({ length: GRABS }, (_, i) => {
        figures.requests++;
        const live = urls();
        return call(live[i % live.length], 'POST', `/coupons/${couponId}/grab`, {
          token: tokenFor(`${round}-u${i}`),
          headers: { 'idempotency-key': `${round}-k${i}` },
          timeoutMs: 60_000,
        });
      }),
    );
  const committedEvents = async () =>
    ((await fdb.db.query(`SELECT id FROM user_coupon_state_log ORDER BY id`)) as { id: string }[]).map((r) => `evt_${r.id}`);
  const uniqueReceived = () => new Set(rx.accepted.map((r) => r.webhookId));

  /** Every committed event arrived, nothing else did, repeats carry the same body; one delivery row per event. */
  async function expectEveryCommittedEventOnce(): Promise<void> {
    const committed = await committedEvents();
    await rx.waitFor(() => uniqueReceived().size >= committed.length, 120_000, `${committed.length} events`);
    await sleep(500);
    expect([...uniqueReceived()].sort()).toEqual([...committed].sort());
    const bodies = new Map<string, string>();
    for (const r of rx.received) {
      const body = JSON.stringify(r.event);
      expect(bodies.get(r.webhookId) ?? body).toBe(body);
      bodies.set(r.webhookId, body);
    }
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM webhook_delivery`)).toBe(committed.length);
    expect(rx.badSignatures).toBe(0);
    figures.events += committed.length;
    figures.repeats += rx.accepted.length - committed.length;
  }

  it('kill -9 of the service mid-stream: after a restart every committed event arrives', async () => {
    let server = await startServer({ dbName: fdb.name, env });
    servers = [server];
    const couponId = await setUp(server.url);
    const replies = grabs(couponId, 'kill', () => [server.url]);
    await rx.waitFor(() => rx.accepted.length >= 250, 60_000, '250 events before the kill');
    await server.crash();
    figures.faults++;
    await replies;
    // The crash cut the stream: some events were out, some not yet.
    expect(uniqueReceived().size).toBeLessThan(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon_state_log`));

    server = await startServer({ dbName: fdb.name, env, port: server.port });
    servers = [server];
    await expectEveryCommittedEventOnce();
    const acked = (await replies).filter((r) => r.status === 201).map((r) => r.body.id as string);
    const events = new Set(rx.accepted.map((r) => String(r.event.data.userCoupon.id)));
    figures.acknowledgedWritesLost += acked.filter((id) => !events.has(id)).length;
    expect(figures.acknowledgedWritesLost).toBe(0);
    const health = await callUntilAnswered(server.url, 'GET', '/health');
    expect(health.status).toBe(200);
  });

  it('three instances: one relays, each event is sent by one of them; kill -9 of that one and another takes over', async () => {
    servers = await Promise.all([0, 1, 2].map(() => startServer({ dbName: fdb.name, env })));
    const couponId = await setUp(servers[0].url);
    const leaders = async (list: Server[]) => {
      const flags = await Promise.all(
        list.map(async (s) =>
          Number(/^webhook_relay_leader (\d)/m.exec((await callUntilAnswered(s.url, 'GET', '/metrics')).body.text as string)?.[1]),
        ),
      );
      return list.filter((_, i) => flags[i] === 1);
    };
    const deadline = Date.now() + 10_000;
    while ((await leaders(servers)).length !== 1 && Date.now() < deadline) await sleep(200);
    const [leader] = await leaders(servers);
    expect(await leaders(servers)).toEqual([leader]);

    const replies = grabs(couponId, 'three', () => servers.map((s) => s.url));
    await rx.waitFor(() => rx.accepted.length >= 250, 60_000, '250 events before the kill');
    const beforeKill = rx.received.map((r) => r.webhookId);
    await leader.crash();
    figures.faults++;
    await replies;
    // Until the kill, one relay sent: no event arrived twice.
    figures.repeatsBeforeKill = beforeKill.length - new Set(beforeKill).size;
    expect(figures.repeatsBeforeKill).toBe(0);

    servers = servers.filter((s) => s !== leader);
    await expectEveryCommittedEventOnce();
    expect(await leaders(servers)).toHaveLength(1);
  });
});

describe('webhook deliveries to a host name', () => {
  let fdb: FaultDatabase;
  let server: Server;
  let rx: WebhookReceiver;
  beforeAll(async () => {
    await buildServer();
    rx = await new WebhookReceiver().start();
    fdb = await createFaultDatabase();
    server = await startServer({
      dbName: fdb.name,
      env: {
        WEBHOOK_RELAY_ENABLED: 'true',
        WEBHOOK_POLL_MS: '50',
        WEBHOOK_RETRY_DELAYS: '1',
        NODE_OPTIONS: `--import=${new URL('./support/fake-dns.mjs', import.meta.url).href}`,
        FAKE_DNS: 'receiver.test=127.0.0.1|169.254.169.254,metadata.test=169.254.169.254',
      },
    });
  });
  afterAll(async () => {
    await server?.stop();
    await fdb?.close();
    await rx?.close();
  });

  it('are connected only where the name resolves to no refused address, looked up at each connection', async () => {
    const port = new URL(rx.url).port;
    const hook = async (host: string) => {
      const res = await call(server.url, 'POST', '/admin/webhooks', { token: adminToken(), body: { url: `http://${host}:${port}/hook` } });
      expect(res.status).toBe(201);
      return res.body as { id: string; secret: string };
    };
    const receiver = await hook('receiver.test');
    rx.secret = receiver.secret;
    const metadata = await hook('metadata.test');
    const coupon = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: 2 }) });
    const grabOne = async (key: string) => {
      const res = await call(server.url, 'POST', `/coupons/${coupon.body.id as string}/grab`, {
        token: tokenFor(`dns-${key}`),
        headers: { 'idempotency-key': key },
      });
      expect(res.status).toBe(201);
      return res;
    };
    const grab = await grabOne('dns-1');
    /** The endpoint's newest delivery once its first attempt is written. */
    const attempted = async (hookId: string) => {
      for (const deadline = Date.now() + 20_000; Date.now() < deadline; await sleep(50)) {
        const list = await call(server.url, 'GET', `/admin/webhooks/${hookId}/deliveries`, { token: adminToken() });
        const [item] = list.body.items as {
          status: string;
          userCouponId: string;
          attempts: { statusCode: number | null; error: string | null }[];
        }[];
        if (item?.attempts.length) return item;
      }
      throw new Error(`no attempt for endpoint ${hookId}`);
    };
    // The name only the fake DNS knows was resolved through the guarded lookup and delivered to.
    expect(await attempted(receiver.id)).toMatchObject({ status: 'DELIVERED', attempts: [{ statusCode: 200, error: null }] });
    expect(rx.received.map((r) => r.event.data.userCoupon.id)).toEqual([grab.body.id]);
    const refused = await attempted(metadata.id);
    expect(refused.attempts[0]).toMatchObject({
      statusCode: null,
      error: expect.stringContaining('metadata.test resolves to 169.254.169.254, a link-local address, where no webhook is delivered'),
    });
    // The receiver's name now resolves to the metadata service (DNS rebinding): the next connection is refused.
    rx.dropConnections();
    const second = await grabOne('dns-2');
    for (const deadline = Date.now() + 20_000; (await attempted(receiver.id)).userCouponId !== second.body.id && Date.now() < deadline;)
      await sleep(50);
    expect((await attempted(receiver.id)).attempts[0]).toMatchObject({
      statusCode: null,
      error: expect.stringContaining('receiver.test resolves to 169.254.169.254'),
    });
    expect(rx.received.map((r) => r.event.data.userCoupon.id)).toEqual([grab.body.id]);
    expect(rx.badSignatures).toBe(0);
  });
});
