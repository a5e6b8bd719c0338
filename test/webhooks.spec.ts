import { jest } from '@jest/globals';
import { getEventListeners } from 'node:events';
import { readFileSync } from 'node:fs';
import { Ajv2020 } from 'ajv/dist/2020.js';
import request from 'supertest';
import { AppConfig, loadConfig, parseAllowedHosts, retryDelays } from '../src/config/app-config.js';
import { DataSource } from 'typeorm';
import { dataSourceOptions } from '../src/database/data-source-options.js';
import { TransactionService } from '../src/database/transaction.service.js';
import { ExpiryService } from '../src/state-machine/expiry.service.js';
import { writersBefore } from '../src/webhooks/cluster-writers.js';
import { FanOut, readCursor } from '../src/webhooks/fan-out.js';
import { WebhookRelay } from '../src/webhooks/relay.service.js';
import { Sender } from '../src/webhooks/sender.js';
import { eventType } from '../src/webhooks/events.js';
import { checkWebhookUrl, guardedLookup } from '../src/webhooks/url-policy.js';
import { createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { WebhookReceiver } from './support/webhook-receiver.js';
import { waitForStatement } from './support/processlist.js';
import { interleaveBefore } from './support/interleave.js';

const admin = () => bearer(adminToken());
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('webhook URL policy and event types (no database)', () => {
  const code = (f: () => unknown) => {
    try {
      f();
      return 'accepted';
    } catch (err) {
      return (err as { code: string }).code;
    }
  };

  it('takes http and https URLs without credentials, and only listed hosts when an allow-list is set', () => {
    expect(checkWebhookUrl('https://hooks.example.com/x?y=1', [])).toBe('https://hooks.example.com/x?y=1');
    for (const bad of [
      'ftp://example.com/',
      'file:///etc/passwd',
      'javascript:alert(1)',
      'not a url',
      '/relative',
      'https://user:pw@example.com/',
      'http://user@example.com/',
    ]) {
      expect([bad, code(() => checkWebhookUrl(bad, []))]).toEqual([bad, 'VALIDATION_FAILED']);
    }
    const allowed = parseAllowedHosts(' hooks.example.com, *.partner.test ');
    expect(code(() => checkWebhookUrl('https://hooks.example.com/a', allowed))).toBe('accepted');
    expect(code(() => checkWebhookUrl('https://a.b.partner.test/a', allowed))).toBe('accepted');
    expect(code(() => checkWebhookUrl('https://HOOKS.example.com/a', allowed))).toBe('accepted');
    for (const bad of [
      'http://127.0.0.1/',
      'http://localhost:8080/',
      'https://partner.test/',
      'https://evilpartner.test/',
      'https://hooks.example.com.evil.io/',
    ]) {
      expect([bad, code(() => checkWebhookUrl(bad, allowed))]).toEqual([bad, 'WEBHOOK_URL_NOT_ALLOWED']);
    }
  });

  it('never takes the cloud metadata service or addresses that are no host, allow-list or not; private and loopback ones it does', () => {
    for (const bad of [
      'http://169.254.169.254/latest/meta-data/',
      'http://[::ffff:169.254.169.254]/',
      'http://[fe80::1]/',
      'http://[fd00:ec2::254]/latest/meta-data/',
      'http://[fd00:ec2::23]/',
      'http://168.63.129.16/',
      'http://[64:ff9b::a9fe:a9fe]/',
      'http://[2002:a9fe:a9fe::]/',
      'http://[::a9fe:a9fe]/',
      'http://[::ffff:0:a9fe:a9fe]/',
      'http://100.100.100.200/latest/meta-data/',
      'http://0.0.0.0:8080/',
      'http://0/',
      'http://224.0.0.1/',
      'http://255.255.255.255/',
    ]) {
      expect([bad, code(() => checkWebhookUrl(bad, []))]).toEqual([bad, 'WEBHOOK_URL_NOT_ALLOWED']);
      expect([bad, code(() => checkWebhookUrl(bad, parseAllowedHosts(new URL(bad).hostname)))]).toEqual([bad, 'WEBHOOK_URL_NOT_ALLOWED']);
    }
    const why = (url: string) => {
      try {
        checkWebhookUrl(url, []);
      } catch (err) {
        return (err as Error).message;
      }
    };
    expect([why('http://0.0.0.0:8080/'), why('http://[fe80::1]/')]).toEqual([
      expect.stringContaining('0.0.0.0 is an unspecified address'),
      expect.stringContaining('is a link-local address'),
    ]);
    for (const ok of [
      'http://127.0.0.1:9000/',
      'http://[::1]:9000/',
      'http://10.0.0.5/hooks',
      'http://[fd12::1]/',
      'http://[64:ff9b::a00:5]/',
      'http://[::ffff:0:a00:5]/',
      'http://orders.internal/',
    ])
      expect([ok, code(() => checkWebhookUrl(ok, []))]).toEqual([ok, 'accepted']);
  });

  it('connects deliveries only where the name resolves to no refused address (checked at each connection)', async () => {
    const resolve = (name: string, all: boolean) =>
      new Promise<unknown>((done) =>
        guardedLookup(name, { all }, (err, address) => done(err ? (err as Error & { code: string }).code : address)),
      );
    expect(await resolve('169.254.169.254', false)).toBe('EADDRNOTALLOWED');
    expect(await resolve('169.254.169.254', true)).toBe('EADDRNOTALLOWED');
    expect(await resolve('127.0.0.1', false)).toBe('127.0.0.1');
    expect(await resolve('localhost', true)).toEqual(expect.arrayContaining([expect.objectContaining({ address: expect.any(String) })]));
  });

  it('maps every transition of the lifecycle to its event type, LOCKED -> UNUSED as released', () => {
    expect(eventType(null, 'UNUSED')).toBe('user_coupon.issued');
    expect(eventType('UNUSED', 'LOCKED')).toBe('user_coupon.locked');
    expect(eventType('LOCKED', 'UNUSED')).toBe('user_coupon.released');
    expect(eventType('LOCKED', 'USED')).toBe('user_coupon.used');
    expect(eventType('UNUSED', 'USED')).toBe('user_coupon.used');
    expect(eventType('LOCKED', 'EXPIRED')).toBe('user_coupon.expired');
    expect(eventType('EXPIRED', 'VOID')).toBe('user_coupon.voided');
  });

  it('retries by default first within 10 s and for at least 24 hours; production refuses a shorter schedule', () => {
    const delays = retryDelays(loadConfig({}));
    expect(delays[0]).toBeLessThanOrEqual(10);
    expect(delays.reduce((a, b) => a + b, 0)).toBeGreaterThanOrEqual(86_400);
    expect(() => loadConfig({ NODE_ENV: 'production', JWT_SECRET: 'x'.repeat(32), WEBHOOK_RETRY_DELAYS: '1,1' })).toThrow(/24 hours/);
    expect(() => loadConfig({ WEBHOOK_RETRY_DELAYS: '1,,2' })).toThrow(/WEBHOOK_RETRY_DELAYS/);
  });
});

describe('webhooks', () => {
  let t: TestApp;
  let rx: WebhookReceiver;
  let webhookId: string;

  beforeAll(async () => {
    t = await startTestApp({
      WEBHOOK_RELAY_ENABLED: 'true',
      WEBHOOK_POLL_MS: '50',
      WEBHOOK_TIMEOUT_MS: '1000',
      WEBHOOK_RETRY_DELAYS: '1,1,1',
      WEBHOOK_DISABLE_AFTER_FAILURES: '2',
    });
    rx = await new WebhookReceiver().start();
  });
  afterAll(async () => {
    await t?.close();
    await rx?.close();
  });
  afterEach(() => {
    expect(rx.badSignatures).toBe(0);
  });

  const createHook = async (url: string, body: Record<string, unknown> = {}) => {
    const res = await request(t.url)
      .post('/admin/webhooks')
      .set(admin())
      .send({ url, ...body });
    expect(res.status).toBe(201);
    return res.body as { id: string; secret: string; events: string[]; enabled: boolean };
  };
  const grab = async (couponId: string, user: string) => {
    const res = await request(t.url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor(user)))
      .set('Idempotency-Key', newKey());
    expect(res.status).toBe(201);
    return res.body.id as string;
  };
  const deliveries = async (id: string, query = '') => {
    const res = await request(t.url).get(`/admin/webhooks/${id}/deliveries${query}`).set(admin());
    expect(res.status).toBe(200);
    return res.body as { items: Record<string, unknown>[]; nextCursor: string | null };
  };
  const logIds = async (ucIds: string[]) =>
    (
      (await t.db.query(
        `SELECT id FROM user_coupon_state_log WHERE user_coupon_id IN (${ucIds.map(() => '?').join(',')}) ORDER BY id`,
        ucIds,
      )) as {
        id: string;
      }[]
    ).map((r) => `evt_${r.id}`);
  /** The delivery of this user coupon's latest event once its outcome is written. */
  const settledDelivery = async (hookId: string, uc: string) => {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const item = (await deliveries(hookId)).items.find((d) => d.userCouponId === uc);
      if ((item && item.status !== 'PENDING') || Date.now() > deadline) return item;
      await sleep(50);
    }
  };
  const forCoupons = (ucIds: string[]) => rx.accepted.filter((r) => ucIds.includes(String(r.event.data.userCoupon.id)));

  it('creates, lists, reads, changes and deletes endpoints; the secret is shown once; bad input is 400/404/403', async () => {
    const created = await createHook(rx.url, { description: 'crm' });
    expect(created).toMatchObject({
      url: rx.url,
      enabled: true,
      description: 'crm',
      events: expect.arrayContaining(['user_coupon.issued', 'user_coupon.voided']),
    });
    expect(created.events).toHaveLength(6);
    expect(created.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    const got = await request(t.url).get(`/admin/webhooks/${created.id}`).set(admin());
    expect(got.status).toBe(200);
    expect(got.body.secret).toBeUndefined();
    const list = await request(t.url).get('/admin/webhooks').set(admin());
    expect(list.body.map((w: { id: string }) => w.id)).toContain(created.id);
    expect(list.body.every((w: Record<string, unknown>) => w.secret === undefined)).toBe(true);

    const patched = await request(t.url)
      .patch(`/admin/webhooks/${created.id}`)
      .set(admin())
      .send({ events: ['user_coupon.used'], enabled: false, url: 'https://hooks.example.com/x' });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ events: ['user_coupon.used'], enabled: false, url: 'https://hooks.example.com/x' });

    for (const body of [
      {},
      { url: 'ftp://x/' },
      { url: 'http://127.0.0.1:0/x' },
      { events: [] },
      { events: ['user_coupon.nope'] },
      { enabled: 'yes' },
      { secret: 'x' },
    ]) {
      const res = await request(t.url).patch(`/admin/webhooks/${created.id}`).set(admin()).send(body);
      expect([JSON.stringify(body), res.status, res.body.code]).toEqual([JSON.stringify(body), 400, 'VALIDATION_FAILED']);
    }
    for (const body of [
      {},
      { url: 'http://u:p@example.com/' },
      { url: 'gopher://example.com/' },
      { url: 5 },
      { url: rx.url, events: 'all' },
      { url: rx.url, extra: 1 },
      // Shown to operators as written: a NUL or a direction override would show something else.
      { url: rx.url, description: 'crm\u0000' },
      { url: rx.url, description: 'mrc\u202e' },
    ]) {
      const res = await request(t.url).post('/admin/webhooks').set(admin()).send(body);
      expect([JSON.stringify(body), res.status, res.body.code]).toEqual([JSON.stringify(body), 400, 'VALIDATION_FAILED']);
    }
    expect(
      (
        await request(t.url)
          .post('/admin/webhooks')
          .set(bearer(tokenFor('mallory')))
          .send({ url: rx.url })
      ).status,
    ).toBe(403);
    expect((await request(t.url).get('/admin/webhooks/999999').set(admin())).body.code).toBe('WEBHOOK_NOT_FOUND');
    expect((await request(t.url).get('/admin/webhooks/abc').set(admin())).status).toBe(400);

    expect((await request(t.url).delete(`/admin/webhooks/${created.id}`).set(admin())).status).toBe(204);
    expect((await request(t.url).get(`/admin/webhooks/${created.id}`).set(admin())).status).toBe(404);
    expect((await request(t.url).delete(`/admin/webhooks/${created.id}`).set(admin())).status).toBe(404);
  });

  it('every kind of change produces its signed event exactly once, with the coupon as it was at that step', async () => {
    const hook = await createHook(rx.url);
    webhookId = hook.id;
    rx.secret = hook.secret;
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const [used, voided, expired] = [await grab(coupon.id, 'wh-a'), await grab(coupon.id, 'wh-b'), await grab(coupon.id, 'wh-c')];
    const redeemed = await request(t.url)
      .post('/redemptions')
      .set(bearer(tokenFor('wh-a')))
      .send({ userCouponId: used, orderNo: 'WH-1', orderAmountCents: 20000 });
    expect(redeemed.status).toBe(201);
    expect((await request(t.url).post(`/admin/user-coupons/${voided}/void`).set(admin()).send({ reason: 'fraud' })).status).toBe(200);
    await t.db.query(`UPDATE user_coupon SET expires_at = ? WHERE id = ?`, [new Date(Date.now() - 1000), expired]);
    expect((await t.app.get(ExpiryService).sweep()).expired).toBe(1);
    expect((await request(t.url).post(`/admin/user-coupons/${expired}/void`).set(admin()).send({ reason: 'cleanup' })).status).toBe(200);

    const ids = [used, voided, expired];
    const expected = await logIds(ids);
    expect(expected).toHaveLength(7);
    await rx.waitFor(() => forCoupons(ids).length >= 7);
    await sleep(300);
    const got = forCoupons(ids);
    expect(got.map((r) => r.webhookId).sort()).toEqual([...expected].sort());
    expect(got.every((r) => r.attempt === 1 && r.event.id === r.webhookId)).toBe(true);
    const byCoupon = (id: string) =>
      got.filter((r) => r.event.data.userCoupon.id === id).map((r) => `${r.event.type}:${r.event.data.userCoupon.status}`);
    expect(byCoupon(used)).toEqual(['user_coupon.issued:UNUSED', 'user_coupon.used:USED']);
    expect(byCoupon(voided)).toEqual(['user_coupon.issued:UNUSED', 'user_coupon.voided:VOID']);
    expect(byCoupon(expired)).toEqual(['user_coupon.issued:UNUSED', 'user_coupon.expired:EXPIRED', 'user_coupon.voided:VOID']);
    const use = got.find((r) => r.event.type === 'user_coupon.used');
    expect(use?.event.data).toMatchObject({
      from: 'UNUSED',
      to: 'USED',
      txId: 'order:WH-1',
      userCoupon: { userId: 'wh-a', couponId: coupon.id, source: 'GRAB' },
    });
    expect(use?.event.data.userCoupon.usedAt).toEqual(expect.any(String));
    expect(got.find((r) => r.event.type === 'user_coupon.issued')?.event.data.userCoupon.usedAt).toBeNull();
    expect(got.find((r) => r.event.data.reason === 'fraud')?.event.type).toBe('user_coupon.voided');
    // What arrived is what the OpenAPI document's webhooks section says arrives, body and headers.
    const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
    ajv.addSchema({ ...(JSON.parse(readFileSync('docs/openapi.json', 'utf8')) as object), $id: 'doc' });
    for (const r of got) {
      const body = ajv.compile({ $ref: `doc#/webhooks/${r.event.type}/post/requestBody/content/application~1json/schema` });
      expect([r.event.type, body(r.event), body.errors ?? null]).toEqual([r.event.type, true, null]);
      for (const [i, name] of ['webhook-id', 'webhook-timestamp', 'webhook-signature'].entries()) {
        const header = ajv.compile({ $ref: `doc#/webhooks/${r.event.type}/post/parameters/${i}/schema` });
        expect([name, header(r.headers[name])]).toEqual([name, true]);
      }
    }

    // The receiver records an event before its 200 reaches the relay: the outcomes are written after.
    const delivered = async () => (await deliveries(hook.id, '?status=DELIVERED&limit=100')).items.length;
    for (const deadline = Date.now() + 10_000; (await delivered()) < 7 && Date.now() < deadline;) await sleep(50);
    const page = await deliveries(hook.id, '?status=DELIVERED&limit=2');
    expect(page.items).toHaveLength(2);
    expect(page.items[0]).toMatchObject({
      status: 'DELIVERED',
      attemptCount: 1,
      lastStatusCode: 200,
      nextAttemptAt: null,
      attempts: [{ statusCode: 200 }],
    });
    expect(page.nextCursor).toEqual(expect.any(String));
    const next = await deliveries(hook.id, `?status=DELIVERED&limit=100&cursor=${page.nextCursor}`);
    expect(next.items.length).toBe(5);
    expect((await request(t.url).get(`/admin/webhooks/${hook.id}/deliveries?status=NOPE`).set(admin())).status).toBe(400);
  });

  it('checkout holds give locked, released and used events, in that order, LOCKED -> UNUSED as released', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 5 });
    const uc = await grab(coupon.id, 'wh-hold');
    const user = bearer(tokenFor('wh-hold'));
    const body = { userCouponId: uc, orderNo: 'WH-H1', orderAmountCents: 20000 };
    expect((await request(t.url).post('/redemptions/holds').set(user).send(body)).status).toBe(201);
    expect((await request(t.url).post('/redemptions/holds/release').set(user).send({ userCouponId: uc, orderNo: 'WH-H1' })).status).toBe(
      200,
    );
    const again = { ...body, orderNo: 'WH-H2' };
    expect((await request(t.url).post('/redemptions/holds').set(user).send(again)).status).toBe(201);
    expect((await request(t.url).post('/redemptions').set(user).send(again)).status).toBe(201);
    const expected = await logIds([uc]);
    expect(expected).toHaveLength(5);
    await rx.waitFor(() => forCoupons([uc]).length >= 5);
    const got = forCoupons([uc]);
    expect(got.map((r) => r.webhookId)).toEqual(expected);
    expect(
      got.map((r) => `${r.event.type}:${String(r.event.data.from)}>${String(r.event.data.to)}:${String(r.event.data.userCoupon.status)}`),
    ).toEqual([
      'user_coupon.issued:null>UNUSED:UNUSED',
      'user_coupon.locked:UNUSED>LOCKED:LOCKED',
      'user_coupon.released:LOCKED>UNUSED:UNUSED',
      'user_coupon.locked:UNUSED>LOCKED:LOCKED',
      'user_coupon.used:LOCKED>USED:USED',
    ]);
  });

  it('a receiver answering 500 gets the event again on the retry, with the same webhook-id, and the attempts are listed', async () => {
    rx.answer = (r) => (r.attempt === 1 ? 500 : 200);
    const coupon = await createCoupon(t.url);
    const uc = await grab(coupon.id, 'wh-retry');
    await rx.waitFor(() => forCoupons([uc]).length === 1);
    const tries = rx.received.filter((r) => r.event.data.userCoupon.id === uc);
    expect(tries.map((r) => [r.attempt, r.status])).toEqual([
      [1, 500],
      [2, 200],
    ]);
    expect(tries[0].webhookId).toBe(tries[1].webhookId);
    expect(tries[1].at - tries[0].at).toBeGreaterThanOrEqual(900);
    const item = await settledDelivery(webhookId, uc);
    expect(item).toMatchObject({ status: 'DELIVERED', attemptCount: 2, lastStatusCode: 200 });
    expect((item?.attempts as { statusCode: number }[]).map((a) => a.statusCode)).toEqual([500, 200]);
    rx.answer = () => 200;
  });

  it('lists a delivery as one moment: an outcome committed between reading the deliveries and their attempts shows whole or not at all', async () => {
    // The first attempt hangs (for up to 30 s in this test): meanwhile the delivery is PENDING with no attempt.
    const config = t.app.get(AppConfig);
    config.WEBHOOK_TIMEOUT_MS = 30_000;
    const hanging = new Set<string>();
    rx.answer = (r) => {
      if (r.attempt > 1) return 200;
      hanging.add(String(r.event.data.userCoupon.id));
      return 'hang';
    };
    try {
      const coupon = await createCoupon(t.url);
      const uc = await grab(coupon.id, 'wh-snapshot');
      await rx.waitFor(() => hanging.has(uc));
      const [{ id: deliveryId }] = (await t.db.query(`SELECT id FROM webhook_delivery WHERE user_coupon_id = ? AND endpoint_id = ?`, [
        uc,
        webhookId,
      ])) as { id: string }[];
      // Another outcome commits just before the attempts are read; the hanging attempt's own outcome,
      // written once its connection drops, finds the delivery no longer pending and is dropped.
      const between = interleaveBefore(
        t.app.get(DataSource),
        (sql) => sql.trimStart().startsWith('SELECT') && sql.includes('FROM webhook_delivery_attempt'),
        () =>
          t.db.transaction(async (em) => {
            await em.query(
              `INSERT INTO webhook_delivery_attempt (delivery_id, attempted_at, status_code, error, duration_ms) VALUES (?, NOW(3), 200, NULL, 5)`,
              [deliveryId],
            );
            await em.query(
              `UPDATE webhook_delivery SET status = 'DELIVERED', attempts = 1, last_status_code = 200, delivered_at = NOW(3) WHERE id = ?`,
              [deliveryId],
            );
          }),
      );
      let during: Record<string, unknown> | undefined;
      try {
        during = (await deliveries(webhookId)).items.find((d) => d.id === deliveryId);
      } finally {
        between.restore();
      }
      expect(between.ran).toBe(1);
      expect(during).toMatchObject({ status: 'PENDING', attemptCount: 0, attempts: [] });
      const after = (await deliveries(webhookId)).items.find((d) => d.id === deliveryId);
      expect(after).toMatchObject({ status: 'DELIVERED', attemptCount: 1, attempts: [{ statusCode: 200 }] });
    } finally {
      config.WEBHOOK_TIMEOUT_MS = 1000;
      rx.answer = () => 200;
      rx.dropConnections();
    }
  });

  // A trickling body: no single wait is long, so only the whole attempt's deadline ends it.
  it.each([
    ['does not answer', 'hang'],
    ['answers 200 but trickles its body', 'trickle'],
  ] as const)('a receiver that %s counts as failed at WEBHOOK_TIMEOUT_MS and is retried', async (_what, answer) => {
    rx.answer = (r) => (r.attempt === 1 ? answer : 200);
    const coupon = await createCoupon(t.url);
    const uc = await grab(coupon.id, `wh-${answer}`);
    await rx.waitFor(() => forCoupons([uc]).length === 1, 15_000);
    const item = await settledDelivery(webhookId, uc);
    expect(item).toMatchObject({ status: 'DELIVERED', attemptCount: 2 });
    const [first] = item?.attempts as { statusCode: number | null; error: string; durationMs: number }[];
    expect(first).toMatchObject({ statusCode: null, error: 'no answer within 1000 ms' });
    expect(first.durationMs).toBeGreaterThanOrEqual(950);
    expect(first.durationMs).toBeLessThan(2500);
    rx.answer = () => 200;
  });

  it('a failing event holds back later events of its own coupon only, and per-coupon order holds under concurrency', async () => {
    // Half the events fail their first attempt and some their second (never more: the test app gives
    // up after three retries); answers come back in random order.
    rx.answer = async (r) => {
      await sleep(Math.random() * 30);
      return (r.attempt === 1 && Math.random() < 0.5) || (r.attempt === 2 && Math.random() < 0.3) ? 503 : 200;
    };
    const coupon = await createCoupon(t.url, { totalStock: 60 });
    const ucs = await Promise.all(Array.from({ length: 60 }, (_, i) => grab(coupon.id, `wh-order-${i}`)));
    await Promise.all(
      ucs.map(async (uc, i) => {
        if (i % 3 === 0) {
          const res = await request(t.url)
            .post('/redemptions')
            .set(bearer(tokenFor(`wh-order-${i}`)))
            .send({ userCouponId: uc, orderNo: `WHO-${i}`, orderAmountCents: 20000 });
          expect(res.status).toBe(201);
        } else {
          expect((await request(t.url).post(`/admin/user-coupons/${uc}/void`).set(admin()).send({ reason: 'order test' })).status).toBe(
            200,
          );
        }
      }),
    );
    const expected = await logIds(ucs);
    expect(expected).toHaveLength(120);
    await rx.waitFor(() => new Set(forCoupons(ucs).map((r) => r.webhookId)).size === 120, 45_000);
    for (const uc of ucs) {
      const accepted = forCoupons([uc]).map((r) => Number(r.webhookId.slice(4)));
      expect(accepted).toEqual([...accepted].sort((a, b) => a - b));
      expect(new Set(accepted).size).toBe(2);
    }
    expect(rx.received.some((r) => r.status === 503)).toBe(true);
    rx.answer = () => 200;
  });

  it('a receiver that never answers does not slow a grab: deliveries run outside every business transaction', async () => {
    rx.answer = () => 'hang';
    // Attempts wait 30 s for this test, so that a grab waiting on a delivery would take that long,
    // far above the bound below even on a loaded machine (the suite's 1 s was within reach of one).
    const config = t.app.get(AppConfig);
    config.WEBHOOK_TIMEOUT_MS = 30_000;
    try {
      const coupon = await createCoupon(t.url, { totalStock: 20 });
      const timed = async (i: number) => {
        const started = Date.now();
        const uc = await grab(coupon.id, `wh-slow-${i}`);
        return { uc, ms: Date.now() - started };
      };
      const first = await timed(0);
      // The first event's POST is now waiting on the receiver.
      await sleep(200);
      const rest = await Promise.all(Array.from({ length: 19 }, (_, i) => timed(i + 1)));
      for (const g of rest) expect(g.ms).toBeLessThan(5_000);
      rx.answer = () => 200;
      // The hanging POSTs fail on the dropped connections and are retried.
      rx.dropConnections();
      const ucs = [first, ...rest].map((g) => g.uc);
      await rx.waitFor(() => forCoupons(ucs).length === 20, 20_000);
    } finally {
      config.WEBHOOK_TIMEOUT_MS = 1000;
      rx.answer = () => 200;
    }
  });

  it('stopping the relay ends all its attempts in flight at once, through one listener on its signal however many there are', async () => {
    rx.answer = () => 'hang';
    const config = t.app.get(AppConfig);
    config.WEBHOOK_TIMEOUT_MS = 30_000;
    const sender = new Sender(t.app.get(DataSource), t.app.get(TransactionService), config, () => undefined);
    const relay = new AbortController();
    try {
      const coupon = await createCoupon(t.url, { totalStock: 20 });
      const ucs = await Promise.all(Array.from({ length: 20 }, (_, i) => grab(coupon.id, `wh-stop-${i}`)));
      const pending = async () => (await deliveries(webhookId, '?limit=100')).items.filter((d) => ucs.includes(String(d.userCouponId)));
      for (const deadline = Date.now() + 10_000; (await pending()).length < 20 && Date.now() < deadline;) await sleep(50);
      // A second sender beside the app's relay: each sends the 20 deliveries, and both wait on the receiver.
      await sender.dispatch(relay.signal);
      expect(sender.idle).toBe(false);
      // Node warns of a leak past 10 listeners on one signal (MaxListenersExceededWarning).
      expect(getEventListeners(relay.signal, 'abort')).toHaveLength(1);
      relay.abort();
      const stopped = Date.now();
      while (!sender.idle && Date.now() - stopped < 5_000) await sleep(20);
      expect(sender.idle).toBe(true);
      // Stopped attempts write nothing: the deliveries stay PENDING for the next relay.
      expect((await pending()).map((d) => d.status)).toEqual(Array(20).fill('PENDING'));
    } finally {
      config.WEBHOOK_TIMEOUT_MS = 1000;
      rx.answer = () => 200;
      rx.dropConnections();
      await sender.close();
    }
  });

  it('an event that keeps failing holds back its own coupon only: the later events of other coupons arrive meanwhile', async () => {
    // Three attempts that time out (1 s each, a second apart): the first event stays pending for about 6 s.
    rx.answer = (r) =>
      r.event.data.userCoupon.userId === 'wh-stuck' && r.event.type === 'user_coupon.issued' && r.attempt <= 3 ? 'hang' : 200;
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const stuck = await grab(coupon.id, 'wh-stuck');
    expect((await request(t.url).post(`/admin/user-coupons/${stuck}/void`).set(admin()).send({ reason: 'held back' })).status).toBe(200);
    const others: string[] = [];
    for (let i = 0; i < 5; i++) others.push(await grab(coupon.id, `wh-free-${i}`));
    await rx.waitFor(() => forCoupons(others).length === 5, 10_000);
    // The stuck coupon's first event is still pending, and its void waits behind it, as its delivery says.
    expect(forCoupons([stuck])).toEqual([]);
    const pending = (await deliveries(webhookId, '?status=PENDING&limit=100')).items.filter((d) => d.userCouponId === stuck);
    const [voided, issued] = pending;
    expect(pending.map((d) => [d.type, d.heldBackBy])).toEqual([
      ['user_coupon.voided', issued.id],
      ['user_coupon.issued', null],
    ]);
    expect(voided.attemptCount).toBe(0);
    await rx.waitFor(() => forCoupons([stuck]).length === 2, 15_000);
    expect(forCoupons([stuck]).map((r) => [r.event.type, r.attempt])).toEqual([
      ['user_coupon.issued', 4],
      ['user_coupon.voided', 1],
    ]);
    rx.answer = () => 200;
  });

  it('every committed log row becomes one event although transactions commit out of id order and rolled-back ids never fill', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100 });
    const ucs = await Promise.all(Array.from({ length: 40 }, (_, i) => grab(coupon.id, `wh-gap-${i}`)));
    await rx.waitFor(() => forCoupons(ucs).length === 40);
    const [{ top: before }] = (await t.db.query(`SELECT MAX(id) AS top FROM user_coupon_state_log`)) as { top: string }[];

    // One transaction inserts its log row first (taking the lower id) and commits last.
    const held = t.db.createQueryRunner();
    await held.startTransaction('READ COMMITTED');
    await held.query(`SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`, [ucs[0]]);
    await held.query(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES (?, 'UNUSED', 'VOID', 'held', NULL, NOW(3))`,
      [ucs[0]],
    );
    const [{ heldId }] = (await held.query(`SELECT LAST_INSERT_ID() AS heldId`)) as { heldId: string }[];
    // Then, concurrently, 39 transactions on other coupons commit or roll back after random delays.
    const outcomes = await Promise.all(
      ucs.slice(1).map(async (uc, i) => {
        const qr = t.db.createQueryRunner();
        await qr.startTransaction('READ COMMITTED');
        await qr.query(`SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`, [uc]);
        await qr.query(
          `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES (?, 'UNUSED', 'VOID', ?, NULL, NOW(3))`,
          [uc, `gap-${i}`],
        );
        await sleep(Math.random() * 400);
        const commit = i % 3 !== 0;
        if (commit) await qr.commitTransaction();
        else await qr.rollbackTransaction();
        await qr.release();
        return commit;
      }),
    );
    const committedLater = outcomes.filter(Boolean).length;
    await rx.waitFor(() => rx.accepted.filter((r) => BigInt(r.webhookId.slice(4)) > BigInt(before)).length === committedLater);
    const cursor = async () => BigInt(((await t.db.query(`SELECT log_id FROM webhook_relay_cursor`)) as { log_id: string }[])[0].log_id);
    // The durable cursor must not pass the row that is still uncommitted.
    expect(await cursor()).toBeLessThan(BigInt(heldId));
    expect(rx.accepted.some((r) => r.webhookId === `evt_${heldId}`)).toBe(false);

    await held.commitTransaction();
    await held.release();
    await rx.waitFor(() => rx.accepted.some((r) => r.webhookId === `evt_${heldId}`));
    const committed = (
      (await t.db.query(`SELECT id FROM user_coupon_state_log WHERE id > ? ORDER BY id`, [before])) as { id: string }[]
    ).map((r) => `evt_${r.id}`);
    expect(committed).toHaveLength(committedLater + 1);
    await sleep(300);
    const after = rx.accepted.filter((r) => BigInt(r.webhookId.slice(4)) > BigInt(before)).map((r) => r.webhookId);
    expect([...after].sort()).toEqual([...committed].sort());
    const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM webhook_delivery WHERE log_id > ?`, [before])) as { n: string }[];
    expect(Number(n)).toBe(committed.length);
    // Once nothing that could fill the rolled-back ids is open any more, the cursor passes them.
    const max = BigInt(committed[committed.length - 1].slice(4));
    const deadline = Date.now() + 15_000;
    while ((await cursor()) < max && Date.now() < deadline) await sleep(100);
    expect(await cursor()).toBe(max);
  });

  it('gives a delivery up after its last retry and disables an endpoint whose deliveries keep failing, and says so', async () => {
    const dead = await new WebhookReceiver().start();
    dead.answer = () => 500;
    const hook = await createHook(dead.url, { events: ['user_coupon.issued'] });
    dead.secret = hook.secret;
    const coupon = await createCoupon(t.url);
    await grab(coupon.id, 'wh-dead-1');
    await grab(coupon.id, 'wh-dead-2');
    const deadline = Date.now() + 20_000;
    let view: Record<string, unknown> = {};
    while (Date.now() < deadline) {
      view = (await request(t.url).get(`/admin/webhooks/${hook.id}`).set(admin())).body;
      if (view.enabled === false) break;
      await sleep(200);
    }
    expect(view).toMatchObject({
      enabled: false,
      failedInRow: 2,
      disabledReason: expect.stringMatching(/^2 deliveries in a row failed every retry \(last: HTTP 500\)$/),
    });
    const failed = await deliveries(hook.id, '?status=FAILED');
    expect(failed.items).toHaveLength(2);
    expect(failed.items[0]).toMatchObject({ attemptCount: 4, lastStatusCode: 500, nextAttemptAt: null });
    expect(dead.received).toHaveLength(8);
    // The counters move just after the commit that the view above already shows.
    const counted = /^webhook_endpoints_disabled_total [1-9]/m;
    let metrics = '';
    for (const until = Date.now() + 5_000; !counted.test(metrics) && Date.now() < until; await sleep(50)) {
      metrics = (await request(t.url).get('/metrics')).text;
    }
    for (const name of [
      'webhook_events_pending',
      'webhook_relay_lag_seconds',
      'webhook_events_delivered_total',
      'webhook_events_retried_total',
    ]) {
      expect(metrics).toMatch(new RegExp(`^${name} \\d`, 'm'));
    }
    expect(Number(/^webhook_events_failed_total (\d+)/m.exec(metrics)?.[1])).toBeGreaterThanOrEqual(2);
    expect(Number(/^webhook_endpoints_disabled_total (\d+)/m.exec(metrics)?.[1])).toBeGreaterThanOrEqual(1);
    // Re-enabled by an operator: the count starts again.
    const on = await request(t.url).patch(`/admin/webhooks/${hook.id}`).set(admin()).send({ enabled: true });
    expect(on.body).toMatchObject({ enabled: true, failedInRow: 0, disabledReason: null });
    await request(t.url).delete(`/admin/webhooks/${hook.id}`).set(admin());
    expect(dead.badSignatures).toBe(0);
    await dead.close();
  });

  it('sends deliveries again on request, every FAILED one or named ones (also DELIVERED), one more attempt each under the first webhook-id', async () => {
    const back = await new WebhookReceiver().start();
    back.answer = () => 500;
    const hook = await createHook(back.url, { events: ['user_coupon.issued'] });
    back.secret = hook.secret;
    const coupon = await createCoupon(t.url);
    const ucs = [await grab(coupon.id, 'wh-again-1'), await grab(coupon.id, 'wh-again-2')];
    const items = async (query = '') => (await deliveries(hook.id, query)).items as { id: string; userCouponId: string; status: string }[];
    for (const until = Date.now() + 20_000; (await items('?status=FAILED')).length < 2 && Date.now() < until;) await sleep(200);
    const failed = await items('?status=FAILED');
    expect(failed.map((d) => d.userCouponId).sort()).toEqual([...ucs].sort());
    // The endpoint is disabled just after the second delivery fails (a loaded CI run redelivered in between).
    const enabled = async () =>
      ((await request(t.url).get(`/admin/webhooks/${hook.id}`).set(admin())).body as { enabled: boolean }).enabled;
    for (const until = Date.now() + 5_000; (await enabled()) && Date.now() < until;) await sleep(50);
    expect(await enabled()).toBe(false);
    const firstIds = new Map(back.received.map((r) => [r.event.data.userCoupon.id, r.webhookId]));
    const redeliver = (body?: object) => {
      const req = request(t.url).post(`/admin/webhooks/${hook.id}/redeliver`).set(admin());
      return body === undefined ? req : req.send(body);
    };

    // The receiver is back, the endpoint was disabled by the failures: sent again, they wait for it to be enabled.
    back.answer = () => 200;
    const all = await redeliver();
    expect([all.status, all.body]).toEqual([200, { redelivered: 2 }]);
    expect((await items()).map((d) => d.status)).toEqual(['PENDING', 'PENDING']);
    expect((await redeliver()).body).toEqual({ redelivered: 0 });
    await sleep(300);
    expect(back.accepted).toHaveLength(0);
    await request(t.url).patch(`/admin/webhooks/${hook.id}`).set(admin()).send({ enabled: true });
    await back.waitFor(() => back.accepted.length === 2);
    expect(back.accepted.map((r) => [r.event.data.userCoupon.id, r.webhookId]).sort()).toEqual([...firstIds].sort());
    for (const until = Date.now() + 5_000; (await items('?status=DELIVERED')).length < 2 && Date.now() < until;) await sleep(50);
    expect(await items('?status=DELIVERED')).toEqual(
      expect.arrayContaining(ucs.map((userCouponId) => expect.objectContaining({ userCouponId, attemptCount: 5, lastStatusCode: 200 }))),
    );

    // A receiver that lost what it was sent gets the named delivery once more.
    const named = await redeliver({ deliveryIds: [failed[0].id] });
    expect([named.status, named.body]).toEqual([200, { redelivered: 1 }]);
    await back.waitFor(() => back.accepted.length === 3);
    expect(back.accepted[2].webhookId).toBe(firstIds.get(failed[0].userCouponId));

    const missing = await redeliver({ deliveryIds: [failed[1].id, '999999999'] });
    expect([missing.status, missing.body.code, missing.body.details]).toEqual([
      404,
      'WEBHOOK_DELIVERY_NOT_FOUND',
      { webhookId: hook.id, deliveryIds: ['999999999'] },
    ]);
    for (const body of [{ deliveryIds: [] }, { deliveryIds: ['x'] }, { deliveryIds: ['1', '1'] }, { deliveryIds: '1' }, { other: 1 }]) {
      const bad = await redeliver(body);
      expect([JSON.stringify(body), bad.status, bad.body.code]).toEqual([JSON.stringify(body), 400, 'VALIDATION_FAILED']);
    }
    const unknown = await request(t.url).post('/admin/webhooks/999999999/redeliver').set(admin());
    expect([unknown.status, unknown.body.code]).toEqual([404, 'WEBHOOK_NOT_FOUND']);
    await sleep(300);
    expect(back.accepted).toHaveLength(3);
    await request(t.url).delete(`/admin/webhooks/${hook.id}`).set(admin());
    expect(back.badSignatures).toBe(0);
    await back.close();
  });

  it('sends every FAILED delivery of an endpoint again in batches of 1,000, each counted once', async () => {
    const hook = await createHook('http://127.0.0.1:9/never', { events: ['user_coupon.issued'] });
    // Disabled, so that the relay leaves them PENDING while they are counted.
    await request(t.url).patch(`/admin/webhooks/${hook.id}`).set(admin()).send({ enabled: false });
    const n = 2_500;
    // Among eight times as many delivered ones, as on an endpoint whose receiver was down for a while.
    const rows = Array.from({ length: n * 9 }, (_, i) => [
      hook.id,
      i + 1,
      i + 1,
      'user_coupon.issued',
      '{}',
      new Date(),
      i % 9 === 0 ? 'FAILED' : 'DELIVERED',
      i % 9 === 0 ? 12 : 1,
      new Date(),
    ]);
    await t.db.query(
      `INSERT INTO webhook_delivery (endpoint_id, log_id, user_coupon_id, event_type, payload, event_at, status, attempts, created_at) VALUES ?`,
      [rows],
    );
    // Each batch in a transaction of its own, so that no transaction locks more than 1,000 deliveries.
    const tx = t.app.get(TransactionService);
    const real = tx.inTransaction.bind(tx);
    let transactions = 0;
    // Each batch's statements, recorded as they are sent.
    const sent: [string, unknown[]][] = [];
    const spy = jest.spyOn(tx, 'inTransaction').mockImplementation((fn) => {
      if (!new Error().stack?.includes('WebhookService.redeliver')) return real(fn);
      transactions++;
      return real((em) =>
        fn(
          new Proxy(em, {
            get: (target, prop) =>
              prop === 'query'
                ? (sql: string, params: unknown[]) => (sent.push([sql, params]), target.query(sql, params))
                : Reflect.get(target, prop, target),
          }),
        ),
      );
    });
    const res = await request(t.url)
      .post(`/admin/webhooks/${hook.id}/redeliver`)
      .set(admin())
      .send({})
      .then((r) => r)
      .finally(() => spy.mockRestore());
    expect([res.status, res.body]).toEqual([200, { redelivered: n }]);
    expect(transactions).toBe(3);
    // A batch is read in id order off idx_due, so its LIMIT bounds the rows read and locked: no sort of
    // every FAILED one (nor a walk of the delivered ones by id).
    const [batchSql, batchParams] = sent.find(([sql]) => /status = 'FAILED'/.test(sql)) ?? ['', []];
    const [plan] = (await t.db.query(`EXPLAIN ${batchSql}`, batchParams)) as { key: string; Extra: string | null }[];
    expect([plan.key, /filesort/.test(plan.Extra ?? '')]).toEqual(['idx_due', false]);
    const [{ pending }] = (await t.db.query(
      `SELECT COUNT(*) AS pending FROM webhook_delivery WHERE endpoint_id = ? AND status = 'PENDING' AND next_attempt_at IS NOT NULL`,
      [hook.id],
    )) as { pending: string }[];
    expect(Number(pending)).toBe(n);
    await request(t.url).delete(`/admin/webhooks/${hook.id}`).set(admin());
  });

  it('a delivery sent again has one attempt: DELIVERED once, then refused, it is FAILED at once, not retried on the schedule', async () => {
    const back = await new WebhookReceiver().start();
    try {
      const hook = await createHook(back.url, { events: ['user_coupon.issued'] });
      back.secret = hook.secret;
      const coupon = await createCoupon(t.url);
      const uc = await grab(coupon.id, 'wh-once-more');
      expect(await settledDelivery(hook.id, uc)).toMatchObject({ status: 'DELIVERED', attemptCount: 1 });
      const [delivery] = (await deliveries(hook.id)).items as { id: string }[];

      back.answer = () => 503;
      const res = await request(t.url)
        .post(`/admin/webhooks/${hook.id}/redeliver`)
        .set(admin())
        .send({ deliveryIds: [delivery.id] });
      expect([res.status, res.body]).toEqual([200, { redelivered: 1 }]);
      // On the schedule (1 s between retries here) it would be PENDING for 3 s more and end with 4 attempts.
      expect(await settledDelivery(hook.id, uc)).toMatchObject({
        status: 'FAILED',
        attemptCount: 2,
        lastStatusCode: 503,
        nextAttemptAt: null,
      });
      await sleep(1_500);
      expect(back.received.map((r) => r.status)).toEqual([200, 503]);
      expect(back.received[1].webhookId).toBe(back.received[0].webhookId);
      await request(t.url).delete(`/admin/webhooks/${hook.id}`).set(admin());
    } finally {
      await back.close();
    }
  });

  it('an attempt whose outcome is written late or twice changes nothing: a delivery made due again since stays due', async () => {
    const hook = await createHook('http://127.0.0.1:9/never', { events: ['user_coupon.issued'] });
    await request(t.url).patch(`/admin/webhooks/${hook.id}`).set(admin()).send({ enabled: false });
    const at = new Date();
    // Delivered on its first attempt, then sent again by an operator: due, one attempt written so far.
    const inserted = (await t.db.query(
      `INSERT INTO webhook_delivery (endpoint_id, log_id, user_coupon_id, event_type, payload, event_at, status, attempts, next_attempt_at, final_attempt, created_at)
       VALUES (?, 1, 1, 'user_coupon.issued', '{}', ?, 'PENDING', 1, ?, 1, ?)`,
      [hook.id, at, at, at],
    )) as { insertId: number };
    const deliveryId = String(inserted.insertId);
    const sender = t.app.get(WebhookRelay).sender as unknown as { outcomes: unknown[]; flush: () => Promise<boolean> };
    const outcome = (attempts: number, statusCode: number) => ({
      deliveryId,
      endpointId: hook.id,
      attempts,
      final: attempts > 1,
      at,
      durationMs: 3,
      statusCode,
      error: null,
    });
    const row = async () =>
      (
        (await t.db.query(
          `SELECT d.status, d.attempts, (SELECT COUNT(*) FROM webhook_delivery_attempt a WHERE a.delivery_id = d.id) AS written
           FROM webhook_delivery d WHERE d.id = ?`,
          [deliveryId],
        )) as { status: string; attempts: number; written: string }[]
      ).map((r) => [r.status, Number(r.attempts), Number(r.written)])[0];

    // The first attempt's outcome once more (a flush retried after its COMMIT was lost, or a relay that lost its lease).
    sender.outcomes.push(outcome(1, 200));
    await sender.flush();
    expect(await row()).toEqual(['PENDING', 1, 0]);
    // The resend's own outcome is written.
    sender.outcomes.push(outcome(2, 200));
    await sender.flush();
    expect(await row()).toEqual(['DELIVERED', 2, 1]);
    await request(t.url).delete(`/admin/webhooks/${hook.id}`).set(admin());
  });

  it("outcomes count towards their endpoint only when written: another relay's stale ones count nowhere, one whose COMMIT went unanswered once", async () => {
    const hook = await createHook('http://127.0.0.1:9/never', { events: ['user_coupon.issued'] });
    const later = new Date(Date.now() + 3_600_000);
    const delivery = async (attempts: number) =>
      String(
        (
          (await t.db.query(
            `INSERT INTO webhook_delivery (endpoint_id, log_id, user_coupon_id, event_type, payload, event_at, status, attempts, next_attempt_at, final_attempt, created_at)
             VALUES (?, ?, 1, 'user_coupon.issued', '{}', NOW(3), 'PENDING', ?, ?, 1, NOW(3))`,
            [hook.id, attempts + 1, attempts, later],
          )) as { insertId: number }
        ).insertId,
      );
    const sender = t.app.get(WebhookRelay).sender as unknown as {
      outcomes: unknown[];
      flush: () => Promise<boolean>;
      tx: TransactionService;
    };
    const failedOnce = (deliveryId: string, attempts: number) => ({
      deliveryId,
      endpointId: hook.id,
      attempts,
      final: true,
      at: new Date(),
      durationMs: 3,
      statusCode: 503,
      error: 'HTTP 503',
    });
    const endpoint = async () =>
      (
        (await t.db.query(`SELECT failed_in_row, enabled FROM webhook_endpoint WHERE id = ?`, [hook.id])) as {
          failed_in_row: number;
          enabled: number;
        }[]
      ).map((r) => [Number(r.failed_in_row), Number(r.enabled)])[0];
    const settled = async (deliveryId: string) => {
      for (let until = Date.now() + 5_000; Date.now() < until; await sleep(50)) {
        const [row] = (await t.db.query(`SELECT status FROM webhook_delivery WHERE id = ?`, [deliveryId])) as { status: string }[];
        if (row.status !== 'PENDING') return row.status;
      }
      return 'PENDING';
    };

    // Two relays overlapping at a lease hand-over both report the same last attempt: written by neither here (the row has moved on).
    const stale = await delivery(2);
    sender.outcomes.push(failedOnce(stale, 2), failedOnce(stale, 2));
    await sender.flush();
    await sleep(200);
    expect(await endpoint()).toEqual([0, 1]);

    // The delivery write committed but its answer was lost: written again it is not, yet it counts once.
    const lost = await delivery(0);
    const tx = sender.tx;
    let calls = 0;
    sender.tx = Object.assign(Object.create(tx) as TransactionService, {
      inTransaction: async <T>(fn: (em: never) => Promise<T>) => {
        const result = await tx.inTransaction(fn as never);
        if (calls++ === 0) throw new Error('injected: the COMMIT was answered by a lost connection');
        return result;
      },
    });
    try {
      sender.outcomes.push(failedOnce(lost, 1));
      await sender.flush().catch(() => undefined);
      expect(calls).toBe(1);
      expect(await settled(lost)).toBe('FAILED');
      await sender.flush();
      for (let until = Date.now() + 5_000; (await endpoint())[0] === 0 && Date.now() < until;) await sleep(50);
      expect(await endpoint()).toEqual([1, 1]);
    } finally {
      sender.tx = tx;
    }
    const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM webhook_delivery_attempt WHERE delivery_id IN (?)`, [[stale, lost]])) as {
      n: string;
    }[];
    expect(Number(n)).toBe(1);
    await request(t.url).delete(`/admin/webhooks/${hook.id}`).set(admin());
  });

  it('a resend racing the removal of its endpoint is answered 404 WEBHOOK_NOT_FOUND, named deliveries or not', async () => {
    for (const body of [{ deliveryIds: ['placeholder'] }, {}]) {
      const hook = await createHook('http://127.0.0.1:9/never', { events: ['user_coupon.issued'] });
      await request(t.url).patch(`/admin/webhooks/${hook.id}`).set(admin()).send({ enabled: false });
      const at = new Date();
      const inserted = (await t.db.query(
        `INSERT INTO webhook_delivery (endpoint_id, log_id, user_coupon_id, event_type, payload, event_at, status, attempts, created_at)
         VALUES (?, 1, 1, 'user_coupon.issued', '{}', ?, 'FAILED', 4, ?)`,
        [hook.id, at, at],
      )) as { insertId: number };
      if (body.deliveryIds) body.deliveryIds = [String(inserted.insertId)];
      // The removal, as DELETE /admin/webhooks/:id does it, open in its own transaction while the resend comes in.
      const removal = t.db.createQueryRunner();
      await removal.connect();
      await removal.startTransaction();
      try {
        await removal.query(`DELETE FROM webhook_endpoint WHERE id = ?`, [hook.id]);
        const resend = request(t.url)
          .post(`/admin/webhooks/${hook.id}/redeliver`)
          .set(admin())
          .send(body)
          .then((r) => r);
        // Committed only once the resend waits for one of the removal's locks: it has read past the endpoint's existence by then.
        await waitForStatement(t.db, [
          'SELECT * FROM webhook\\_endpoint WHERE id = % LOCK IN SHARE MODE',
          'SELECT id FROM webhook\\_delivery WHERE endpoint\\_id = %FOR UPDATE',
        ]);
        await removal.commitTransaction();
        const res = await resend;
        expect([JSON.stringify(body), res.status, res.body.code]).toEqual([JSON.stringify(body), 404, 'WEBHOOK_NOT_FOUND']);
      } finally {
        await removal.release();
      }
    }
  });

  it("the relay's lag leaves out a disabled endpoint's deliveries: they wait for an operator, not for the relay", async () => {
    const parked = await createHook('http://127.0.0.1:9/never', { events: ['user_coupon.issued'] });
    await request(t.url).patch(`/admin/webhooks/${parked.id}`).set(admin()).send({ enabled: false });
    const hourAgo = new Date(Date.now() - 3_600_000);
    await t.db.query(
      `INSERT INTO webhook_delivery (endpoint_id, log_id, user_coupon_id, event_type, payload, event_at, status, attempts, next_attempt_at, created_at)
       VALUES (?, 1, 1, 'user_coupon.issued', '{}', ?, 'PENDING', 0, ?, ?)`,
      [parked.id, hourAgo, hourAgo, hourAgo],
    );
    const gauge = async (name: string) => Number(new RegExp(`^${name} (\\S+)`, 'm').exec((await request(t.url).get('/metrics')).text)?.[1]);
    // The gauges are written about once a second: watched for 2.5 s, the lag has been written twice since the insert.
    let highest = 0;
    for (const until = Date.now() + 2_500; Date.now() < until; await sleep(100))
      highest = Math.max(highest, await gauge('webhook_relay_lag_seconds'));
    expect(highest).toBeLessThan(600);
    await request(t.url).delete(`/admin/webhooks/${parked.id}`).set(admin());
  });

  it('deletes an endpoint at once whatever its deliveries, and the relay then removes them with their attempts in batches', async () => {
    const gone = await createHook('http://127.0.0.1:9/never', { events: ['user_coupon.issued'] });
    const kept = await createHook('http://127.0.0.1:9/never', { events: ['user_coupon.issued'] });
    for (const hook of [gone, kept]) await request(t.url).patch(`/admin/webhooks/${hook.id}`).set(admin()).send({ enabled: false });
    const counts = async (hookId: string) => {
      const [r] = (await t.db.query(
        `SELECT COUNT(DISTINCT d.id) AS deliveries, COUNT(a.id) AS attempts
         FROM webhook_delivery d LEFT JOIN webhook_delivery_attempt a ON a.delivery_id = d.id WHERE d.endpoint_id = ?`,
        [hookId],
      )) as { deliveries: string; attempts: string }[];
      return [Number(r.deliveries), Number(r.attempts)];
    };
    // 2.5 batches for the deleted endpoint, a few for the kept one; every delivery with an attempt.
    for (const [hook, n] of [
      [gone, 2_500],
      [kept, 10],
    ] as const) {
      const at = new Date();
      const rows = Array.from({ length: n }, (_, i) => [hook.id, i + 1, i + 1, 'user_coupon.issued', '{}', at, 'FAILED', 1, at]);
      await t.db.query(
        `INSERT INTO webhook_delivery (endpoint_id, log_id, user_coupon_id, event_type, payload, event_at, status, attempts, created_at) VALUES ?`,
        [rows],
      );
      await t.db.query(
        `INSERT INTO webhook_delivery_attempt (delivery_id, attempted_at, status_code, error, duration_ms)
         SELECT id, created_at, 500, NULL, 1 FROM webhook_delivery WHERE endpoint_id = ?`,
        [hook.id],
      );
      expect(await counts(hook.id)).toEqual([n, n]);
    }
    // One of its deliveries held, as the sender holds one while writing an attempt back: the endpoint's
    // removal must not wait for it (it once deleted every delivery in its own transaction, and on a
    // backlog of a few hundred thousand outlived the request's deadline and rolled back: 503, never deleted).
    const holder = t.db.createQueryRunner();
    await holder.connect();
    await holder.startTransaction();
    try {
      await holder.query(`SELECT id FROM webhook_delivery WHERE endpoint_id = ? AND log_id = 2500 FOR UPDATE`, [gone.id]);
      const started = Date.now();
      const res = await request(t.url).delete(`/admin/webhooks/${gone.id}`).set(admin());
      expect([res.status, Date.now() - started < 2_000]).toEqual([204, true]);
      expect((await request(t.url).get(`/admin/webhooks/${gone.id}`).set(admin())).status).toBe(404);
      expect((await request(t.url).get(`/admin/webhooks/${gone.id}/deliveries`).set(admin())).status).toBe(404);
      // Each batch commits on its own: the first goes although a later delivery is held (how many more go
      // before the held one depends on whether the server reads a batch's DELETE by key or by scan).
      for (const until = Date.now() + 10_000; (await counts(gone.id))[0] > 2_000 && Date.now() < until;) await sleep(50);
      const [left, leftAttempts] = await counts(gone.id);
      expect([left <= 2_000, left > 0, leftAttempts]).toEqual([true, true, left]);
    } finally {
      await holder.commitTransaction();
      await holder.release();
    }
    for (const until = Date.now() + 10_000; (await counts(gone.id))[0] > 0 && Date.now() < until;) await sleep(50);
    expect(await counts(gone.id)).toEqual([0, 0]);
    expect(await counts(kept.id)).toEqual([10, 10]);
    await request(t.url).delete(`/admin/webhooks/${kept.id}`).set(admin());
  });

  it('an endpoint write that fails after its deliveries committed is done again alone: nothing counted twice or lost, no attempt written twice', async () => {
    const dead = await new WebhookReceiver().start();
    dead.answer = () => 500;
    const hook = await createHook(dead.url, { events: ['user_coupon.issued'] });
    dead.secret = hook.secret;
    const failedTotal = async () =>
      Number(/^webhook_events_failed_total (\d+)/m.exec((await request(t.url).get('/metrics')).text)?.[1] ?? 0);
    const before = await failedTotal();
    // Fault injection on the real database: the first endpoint transaction fails, as a lost connection would.
    const sender = t.app.get(WebhookRelay).sender as unknown as { writeEndpoints: (...args: unknown[]) => Promise<unknown> };
    const real = sender.writeEndpoints.bind(sender);
    let calls = 0;
    sender.writeEndpoints = (...args) => (calls++ === 0 ? Promise.reject(new Error('injected: endpoint write failed')) : real(...args));
    let view: Record<string, unknown> = {};
    try {
      const coupon = await createCoupon(t.url);
      await grab(coupon.id, 'wh-endpoint-fail-1');
      await grab(coupon.id, 'wh-endpoint-fail-2');
      for (const until = Date.now() + 20_000; view.enabled !== false && Date.now() < until; await sleep(200)) {
        view = (await request(t.url).get(`/admin/webhooks/${hook.id}`).set(admin())).body;
      }
    } finally {
      sender.writeEndpoints = real;
    }
    expect(calls).toBeGreaterThanOrEqual(2);
    expect(view).toMatchObject({ enabled: false, failedInRow: 2 });
    const failed = await deliveries(hook.id, '?status=FAILED');
    expect(failed.items.map((d) => d.attemptCount)).toEqual([4, 4]);
    const [{ n }] = (await t.db.query(
      `SELECT COUNT(*) AS n FROM webhook_delivery_attempt a JOIN webhook_delivery d ON d.id = a.delivery_id WHERE d.endpoint_id = ?`,
      [hook.id],
    )) as { n: string }[];
    expect(Number(n)).toBe(8);
    let counted = 0;
    for (const until = Date.now() + 5_000; counted < 2 && Date.now() < until; await sleep(50)) counted = (await failedTotal()) - before;
    expect(counted).toBe(2);
    await request(t.url).delete(`/admin/webhooks/${hook.id}`).set(admin());
    await dead.close();
  });
});

describe('the relay closing gaps in the state-log ids', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ WEBHOOK_RELAY_ENABLED: 'false' });
  });
  afterAll(async () => {
    await t?.close();
  });

  // information_schema.innodb_trx is rebuilt only after 100 ms without a read: a relay passing more
  // often than that (WEBHOOK_POLL_MS 50, or a backlog) kept reading a list that still showed a
  // rolled-back writer, and its cursor never passed the gap.
  /** Two log rows, the lower one of a transaction left open (`beforeOpen` writes first); passes of `fanOut` every 20 ms meanwhile. */
  const openGap = async (fanOut: FanOut, beforeOpen?: (uc: string) => Promise<void>) => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const ucs: string[] = [];
    for (const user of ['gap-a', 'gap-b']) {
      const res = await request(t.url)
        .post(`/coupons/${coupon.id}/grab`)
        .set(bearer(tokenFor(user)))
        .set('Idempotency-Key', newKey());
      ucs.push(res.body.id as string);
    }
    const insertLog = (db: { query: DataSource['query'] }, uc: string) =>
      db.query(
        `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES (?, 'UNUSED', 'VOID', 'gap-test', NULL, NOW(3))`,
        [uc],
      );
    await beforeOpen?.(ucs[0]);
    const writer = t.db.createQueryRunner();
    await writer.startTransaction();
    await insertLog(writer, ucs[0]);
    const [{ gapId }] = (await writer.query('SELECT LAST_INSERT_ID() AS gapId')) as { gapId: string }[];
    await insertLog(t.db, ucs[1]);
    const [{ top }] = (await t.db.query('SELECT MAX(id) AS top FROM user_coupon_state_log')) as { top: string }[];
    expect(BigInt(top)).toBeGreaterThan(BigInt(gapId));
    return {
      gapId: BigInt(gapId),
      top: BigInt(top),
      rollBack: async () => {
        await writer.rollbackTransaction();
        await writer.release();
      },
      commit: async () => {
        await writer.commitTransaction();
        await writer.release();
      },
      passFor: async (ms: number, until: () => Promise<boolean> = async () => false) => {
        const end = Date.now() + ms;
        while (Date.now() < end && !(await until())) {
          await fanOut.pass();
          await sleep(20);
        }
      },
    };
  };
  const cursor = async () => BigInt(await readCursor(t.db));

  it('passes a rolled-back id although passes come every 20 ms, and not while its writer is open', async () => {
    const gap = await openGap(new FanOut(t.app.get(DataSource), t.app.get(TransactionService), t.config));
    await gap.passFor(1500);
    expect(await cursor()).toBe(gap.gapId - 1n);
    await gap.rollBack();
    await gap.passFor(5000, async () => (await cursor()) === gap.top);
    expect(await cursor()).toBe(gap.top);
  });

  it('does not trust a list of writers built during an earlier check on the same connection, kept by another reader polling it', async () => {
    const check = t.db.createQueryRunner();
    const writer = t.db.createQueryRunner();
    let polling = true;
    let poller = Promise.resolve();
    const checkOnce = async () => {
      await check.startTransaction('READ COMMITTED');
      try {
        return await writersBefore((sql) => check.query(sql));
      } finally {
        await check.rollbackTransaction();
      }
    };
    try {
      await check.connect();
      // A first check that built the list itself (another test file's reads may have kept an older one).
      let first = await checkOnce();
      for (const until = Date.now() + 10_000; first === 'stale' && Date.now() < until; first = await checkOnce()) await sleep(150);
      expect(first).toEqual([]);
      // Reads of the view every 20 ms from now on, as a monitoring agent's: the list is rebuilt only
      // after 100 ms without one, so the first check's stays.
      poller = (async () => {
        for (; polling; await sleep(20)) await t.db.query(`SELECT COUNT(*) FROM information_schema.innodb_trx`);
      })();
      await writer.startTransaction();
      await writer.query(
        `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES (0, NULL, 'UNUSED', 'open-writer', NULL, NOW(3))`,
      );
      const again = await checkOnce();
      // Stale, or the writer listed: never "no writer" while one is open.
      expect(again === 'stale' || again.length === 1).toBe(true);
    } finally {
      polling = false;
      await poller;
      if (writer.isTransactionActive) await writer.rollbackTransaction();
      await writer.release();
      await check.release();
    }
  });

  it('passes a rolled-back gap wider than a thousand ids, and turns a row above it that committed late', async () => {
    const hook = await request(t.url).post('/admin/webhooks').set(bearer(adminToken())).send({ url: 'http://127.0.0.1:9/hook' });
    expect(hook.status).toBe(201);
    // Below the open row: a bulk batch of 1,500 log rows rolled back (a crashed runner's), ids never filled.
    const wideGap = async (uc: string) => {
      const bulk = t.db.createQueryRunner();
      await bulk.startTransaction();
      await bulk.query(
        `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
         SELECT ?, 'UNUSED', 'VOID', 'wide-gap', NULL, NOW(3) FROM seq_1_to_1500`,
        [uc],
      );
      await bulk.rollbackTransaction();
      await bulk.release();
    };
    const gap = await openGap(new FanOut(t.app.get(DataSource), t.app.get(TransactionService), t.config), wideGap);
    await gap.passFor(1500);
    // The open row holds the cursor (below the wide gap too: its writer might have taken ids there);
    // then it commits, and becomes an event although 1,500 missing ids lie below it.
    expect(await cursor()).toBeLessThan(gap.gapId - 1500n);
    await gap.commit();
    const delivered = async () =>
      ((await t.db.query(`SELECT COUNT(*) AS n FROM webhook_delivery WHERE log_id = ?`, [String(gap.gapId)])) as { n: string }[])[0].n;
    await gap.passFor(5000, async () => (await cursor()) === gap.top);
    expect([await cursor(), await delivered()]).toEqual([gap.top, '1']);
    await request(t.url).delete(`/admin/webhooks/${hook.body.id}`).set(bearer(adminToken()));
  });

  it('without the PROCESS privilege waits WEBHOOK_GAP_MAX_AGE_SECONDS for a gap, then passes it', async () => {
    const user = `ce_noproc_${process.pid}`;
    await t.db.query(`CREATE USER IF NOT EXISTS '${user}'@'%' IDENTIFIED BY 'pw'`);
    await t.db.query(`GRANT ALL PRIVILEGES ON \`${t.config.DB_NAME}\`.* TO '${user}'@'%'`);
    const config = { ...t.config, DB_USER: user, DB_PASSWORD: 'pw', WEBHOOK_GAP_MAX_AGE_SECONDS: 3 };
    const unprivileged = new DataSource({ ...dataSourceOptions(config), poolSize: 2 });
    await unprivileged.initialize();
    try {
      await expect(unprivileged.query('SELECT COUNT(*) FROM information_schema.innodb_trx')).rejects.toMatchObject({ errno: 1227 });
      const gap = await openGap(new FanOut(unprivileged, t.app.get(TransactionService), config));
      await gap.passFor(1000);
      expect(await cursor()).toBe(gap.gapId - 1n);
      await gap.rollBack();
      // The check cannot tell that the writer has gone: the gap is kept until it is 3 s old.
      const rolledBackAt = Date.now();
      await gap.passFor(8000, async () => (await cursor()) === gap.top);
      expect(await cursor()).toBe(gap.top);
      expect(Date.now() - rolledBackAt).toBeGreaterThan(500);
    } finally {
      await unprivileged.destroy();
      await t.db.query(`DROP USER IF EXISTS '${user}'@'%'`);
    }
  });
});

describe('webhooks with WEBHOOK_ALLOWED_HOSTS', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ WEBHOOK_ALLOWED_HOSTS: 'hooks.example.com,*.partner.test' });
  });
  afterAll(() => t?.close());

  it('takes listed hosts and answers 422 WEBHOOK_URL_NOT_ALLOWED for others, on create and on change', async () => {
    const ok = await request(t.url).post('/admin/webhooks').set(admin()).send({ url: 'https://crm.partner.test/in' });
    expect(ok.status).toBe(201);
    for (const url of [
      'http://127.0.0.1:6379/',
      'http://localhost/hook',
      'https://partner.test/',
      'http://169.254.169.254/latest/meta-data',
    ]) {
      const res = await request(t.url).post('/admin/webhooks').set(admin()).send({ url });
      expect([url, res.status, res.body.code]).toEqual([url, 422, 'WEBHOOK_URL_NOT_ALLOWED']);
    }
    const moved = await request(t.url).patch(`/admin/webhooks/${ok.body.id}`).set(admin()).send({ url: 'http://10.0.0.5/' });
    expect([moved.status, moved.body.code]).toEqual([422, 'WEBHOOK_URL_NOT_ALLOWED']);
    const list = await request(t.url).get('/admin/webhooks').set(admin());
    expect(list.body.map((w: { url: string }) => w.url)).toEqual(['https://crm.partner.test/in']);
  });
});
