import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import request from 'supertest';
import { couponBody, createCoupon, grabUserCoupon, newKey, redeemUserCoupon } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { ROUTES } from '../src/openapi/routes.js';
import { ContractChecker, OPENAPI_PATH } from './support/contract.js';
import { CommitFate, startTcpProxy, TcpProxy } from './support/tcp-proxy.js';

/**
 * The answers every operation of docs/openapi.json documents for its kind (a request too slow or
 * its headers too large, an undeclared query parameter, no token or the wrong role, a body too
 * large or of another type, the database unavailable, a lost COMMIT), provoked on every operation
 * the document lists, so the harness checks each against the document (test-results/contract-
 * coverage.txt lists what no test produces). The operations come from the document itself: one
 * added there is covered here without a new line.
 */

const DEADLINE_MS = 3000;
const METRICS_TOKEN = 'metrics-token-0123456789';
const real = { host: process.env.DB_HOST ?? '127.0.0.1', port: Number(process.env.DB_PORT ?? 3306) };

interface Op {
  method: string;
  /** The document's path (`/coupons/{couponId}`). */
  route: string;
  responses: Record<
    string,
    { content?: { 'application/json'?: { schema?: { allOf?: [unknown, { properties: { code: { enum: string[] } } }] } } } }
  >;
  security?: unknown[];
  'x-roles'?: string[];
  requestBody?: { content: Record<string, { example?: unknown }> };
}

const doc = JSON.parse(readFileSync(OPENAPI_PATH, 'utf8')) as { paths: Record<string, Record<string, Omit<Op, 'method' | 'route'>>> };
const OPS: Op[] = Object.entries(doc.paths).flatMap(([route, item]) =>
  Object.entries(item).map(([method, op]) => ({ ...op, method: method.toUpperCase(), route })),
);
const name = (op: Op) => `${op.method} ${op.route}`;
const documents = (op: Op, status: number, code: string) =>
  op.responses[String(status)]?.content?.['application/json']?.schema?.allOf?.[1].properties.code.enum.includes(code) ?? false;
const takesBody = (op: Op) => documents(op, 415, 'UNSUPPORTED_MEDIA_TYPE');

/** A token the operation accepts: its role, a plain user, or the metrics token for GET /metrics. */
function tokenOf(op: Op): string | undefined {
  if (op.route === '/metrics') return METRICS_TOKEN;
  if (op.security?.length === 0) return undefined;
  const roles = op['x-roles'];
  if (roles?.includes('admin')) return adminToken();
  if (roles?.includes('service')) return serviceToken();
  return tokenFor('contract-user');
}

interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * Writes `head` (and `body`) on a fresh connection, then `more` once it resolves, and reads the
 * answer until the server closes it, or `maxMs` passes.
 */
function raw(url: string, head: string, body = '', maxMs = DEADLINE_MS * 4, more?: Promise<string>): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    let text = '';
    const socket = connect(Number(new URL(url).port), '127.0.0.1', () => {
      socket.write(head + body);
      void more?.then((bytes) => socket.write(bytes));
    });
    const done = () => {
      clearTimeout(timer);
      socket.destroy();
      const [top, ...rest] = text.split('\r\n\r\n');
      const [statusLine, ...lines] = top.split('\r\n');
      const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1] ?? 0);
      if (!status) return reject(new Error(`no answer: ${JSON.stringify(text.slice(0, 200))}`));
      const headers = Object.fromEntries(
        lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()] as [string, string]),
      );
      let payload = rest.join('\r\n\r\n');
      if (headers['transfer-encoding'] === 'chunked') payload = payload.replace(/^[0-9a-f]+\r\n/, '').replace(/\r\n0\r\n\r\n$/, '');
      resolve({ status, headers, body: payload });
    };
    const timer = setTimeout(done, maxMs);
    socket.on('data', (c) => (text += c.toString()));
    socket.on('close', done);
    socket.on('error', () => undefined);
  });
}

/** Required query parameters, where an operation has them. */
const QUERY: Record<string, string> = { 'GET /me/coupons/usable': '?orderAmountCents=20000', 'GET /admin/user-coupons': '?userId=alice' };

const RUN = 'POST /admin/reconciliation/runs';

const headLines = (method: string, path: string, headers: Record<string, string | number>) =>
  [`${method} ${path} HTTP/1.1`, 'Host: localhost', ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`), '', ''].join('\r\n');

describe('contract coverage: the answers every operation documents', () => {
  let proxy: TcpProxy;
  let t: TestApp;
  const checker = new ContractChecker();
  /** Path parameters that name things the fixtures made (where it matters) or a well-formed id. */
  const params: Record<string, string> = { couponId: '1', userCouponId: '1', runId: '1', id: '1', webhookId: '1', jobId: '1' };
  params.userId = 'alice';
  params.idempotencyKey = 'never-used-key';
  const pathOf = (op: Op) => op.route.replace(/\{([A-Za-z]+)\}/g, (_m, p: string) => encodeURIComponent(params[p]));
  /** A request the operation validates and takes to the database: its path, its token, the document's example body. */
  const valid = (op: Op) => {
    const r = send(op, pathOf(op) + (QUERY[name(op)] ?? '')).set('Idempotency-Key', newKey('valid'));
    const example = op.requestBody?.content['application/json']?.example;
    return example === undefined ? r : r.send(example as object);
  };
  const send = (op: Op, path = pathOf(op)) => {
    const r = request(t.url)[op.method.toLowerCase() as 'get'](path);
    const token = tokenOf(op);
    return token ? r.set(bearer(token)) : r;
  };

  /** The compensations a reconciliation run started now proposes for the stock of these coupons. */
  async function compensationsFor(...couponIds: string[]): Promise<{ id: string; action: string }[]> {
    const started = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken())).send({ mode: 'FULL' });
    expect(started.status).toBe(202);
    let run = { status: 'RUNNING' };
    for (let i = 0; i < 200 && run.status === 'RUNNING'; i++) {
      await new Promise((r) => setTimeout(r, 50));
      run = (await request(t.url).get(`/admin/reconciliation/runs/${started.body.runId}`).set(bearer(adminToken()))).body;
    }
    const page = await request(t.url)
      .get(`/admin/compensations?status=PENDING&runId=${started.body.runId}&limit=100`)
      .set(bearer(adminToken()));
    const items = page.body.items as { id: string; action: string; params: { couponId?: string } }[];
    return couponIds.map((couponId) => {
      const found = items.find((c) => c.params.couponId === couponId);
      if (!found) throw new Error(`no compensation for coupon ${couponId} in ${JSON.stringify(page.body)}`);
      return found;
    });
  }

  /** What the proxy does with the COMMITs to come: `next` in order, then `rest`. A dropped one is cut before it reaches the server. */
  const commits = { next: [] as CommitFate[], rest: 'pass' as CommitFate };
  const onCommit = (): CommitFate => commits.next.shift() ?? commits.rest;

  beforeAll(async () => {
    proxy = await startTcpProxy(real, { onCommit });
    t = await startTestApp({
      DB_HOST: '127.0.0.1',
      DB_PORT: String(proxy.port),
      // Every request in the outage waves below holds a connection of the pool opened at boot.
      DB_POOL_SIZE: '40',
      REQUEST_TIMEOUT_MS: String(DEADLINE_MS),
      BULK_UPLOAD_TIMEOUT_MS: String(DEADLINE_MS),
      OUTCOME_RESOLVE_MS: '500',
      COUPON_CACHE_TTL_MS: '0',
      METRICS_TOKEN,
      WEBHOOK_ALLOWED_HOSTS: 'hooks.example.org',
    });
    const coupon = await createCoupon(t.url, { totalStock: 100 });
    params.couponId = coupon.id;
  });
  afterAll(async () => {
    await t.close();
    await proxy.close();
  });

  it('reads every operation of the document', () => {
    expect(OPS.length).toBeGreaterThanOrEqual(40);
    for (const op of OPS) expect([name(op), checker.routeOf(op.method, pathOf(op))]).toEqual([name(op), op.route]);
  });

  it('an undeclared query parameter is 400 VALIDATION_FAILED on every operation', async () => {
    const answers = await Promise.all(OPS.map(async (op) => [name(op), (await send(op, `${pathOf(op)}?undeclared=1`)).body.code]));
    expect(answers).toEqual(OPS.map((op) => [name(op), 'VALIDATION_FAILED']));
  });

  it('no token is 401 UNAUTHENTICATED, a token without the role 403 FORBIDDEN, where documented', async () => {
    const secured = OPS.filter((op) => documents(op, 401, 'UNAUTHENTICATED'));
    const roled = OPS.filter((op) => op['x-roles']);
    const anonymous = await Promise.all(
      secured.map(async (op) => [name(op), (await request(t.url)[op.method.toLowerCase() as 'get'](pathOf(op))).status]),
    );
    expect(anonymous).toEqual(secured.map((op) => [name(op), 401]));
    const plain = await Promise.all(
      roled.map(async (op) => [
        name(op),
        (
          await request(t.url)
            [op.method.toLowerCase() as 'get'](pathOf(op))
            .set(bearer(tokenFor('no-roles')))
        ).body.code,
      ]),
    );
    expect(plain).toEqual(roled.map((op) => [name(op), 'FORBIDDEN']));
    expect(secured.length).toBeGreaterThan(30);
  });

  it('a body over the limit is 413 PAYLOAD_TOO_LARGE on every operation (a GET takes none), another media type 415 on every one that takes a body', async () => {
    const bodied = OPS.filter(takesBody);
    // Refused on its Content-Length alone, before it is read: 65 MiB is over every route's limit.
    const large = await Promise.all(
      OPS.map(async (op) => {
        const head = headLines(op.method, pathOf(op), {
          ...(tokenOf(op) ? { Authorization: `Bearer ${tokenOf(op)}` } : {}),
          'Content-Type': 'application/json',
          'Content-Length': 65 * 1024 * 1024,
          'Idempotency-Key': newKey('big'),
          Connection: 'close',
        });
        return [name(op), (await raw(t.url, head, '{"a":')).status];
      }),
    );
    expect(large).toEqual(OPS.map((op) => [name(op), 413]));
    const xml = await Promise.all(
      bodied.map(async (op) => [
        name(op),
        (await send(op).set('Idempotency-Key', newKey('xml')).set('Content-Type', 'application/xml').send('<coupon/>')).body.code,
      ]),
    );
    expect(xml).toEqual(bodied.map((op) => [name(op), 'UNSUPPORTED_MEDIA_TYPE']));
    expect(bodied.length).toBeGreaterThan(15);
  });

  it('headers over the size limit are 431 HEADERS_TOO_LARGE on every operation', async () => {
    const answers = await Promise.all(
      OPS.map(async (op) => {
        const answer = await raw(t.url, headLines(op.method, pathOf(op), { 'X-Big': 'a'.repeat(20_000) }));
        // Node answers before any route runs: checked here, against the operation the request line named.
        t.checkAnswer({ method: op.method, route: op.route, status: answer.status, headers: answer.headers, body: answer.body });
        return [name(op), answer.status, JSON.parse(answer.body).code];
      }),
    );
    expect(answers).toEqual(OPS.map((op) => [name(op), 431, 'HEADERS_TOO_LARGE']));
  });

  it('a request still arriving at the deadline is 408 REQUEST_TIMEOUT on every operation: a slow body, or slow headers where there is no body', async () => {
    const started = Date.now();
    const answers = await Promise.all(
      OPS.map(async (op) => {
        const token = tokenOf(op);
        if (takesBody(op)) {
          // Half the body, then nothing: the route's deadline ends it, answered through the app.
          const head = headLines(op.method, pathOf(op), {
            ...(token ? { Authorization: `Bearer ${token}` } : {}),
            'Content-Type': 'application/json',
            'Content-Length': 20,
            'Idempotency-Key': newKey('slow'),
          });
          const answer = await raw(t.url, head, '{"reason":');
          return [name(op), answer.status, JSON.parse(answer.body).code];
        }
        // The headers never end: Node's header deadline answers before routing.
        const answer = await raw(t.url, `${op.method} ${pathOf(op)} HTTP/1.1\r\nHost: localhost\r\nX-Slow: 1\r\n`);
        t.checkAnswer({ method: op.method, route: op.route, status: answer.status, headers: answer.headers, body: answer.body });
        return [name(op), answer.status, JSON.parse(answer.body).code];
      }),
    );
    expect(answers).toEqual(OPS.map((op) => [name(op), 408, 'REQUEST_TIMEOUT']));
    // Node checks its header deadline once a second.
    expect(Date.now() - started).toBeLessThan(DEADLINE_MS * 3);
  });

  describe('answers a route gives only on rare data', () => {
    const admin = () => bearer(adminToken());
    const sql = (query: string, args: unknown[]) => t.db.query(query, args) as Promise<unknown>;

    it('409 STATUS_CONFLICT: a coupon LOCKED with no active hold (a gap reconciliation reports) to a void, a redemption and a hold; a hold whose coupon is no longer LOCKED to its release', async () => {
      const coupon = await createCoupon(t.url, { totalStock: 10, perUserLimit: 5 });
      const [toVoid, toRedeem, toHold, toRelease] = await Promise.all(
        [1, 2, 3, 4].map(() => grabUserCoupon(t.url, coupon.id, 'sc-user', newKey('sc'))),
      );
      const user = bearer(tokenFor('sc-user'));
      const order = newKey('ORD');
      const held = await request(t.url)
        .post('/redemptions/holds')
        .set(user)
        .send({ userCouponId: toRelease.id, orderNo: order, orderAmountCents: 20_000 });
      expect(held.status).toBe(201);
      await sql(`UPDATE user_coupon SET status = 'LOCKED', locked_until = NOW(3) - INTERVAL 1 MINUTE WHERE id IN (?)`, [
        [toVoid.id, toRedeem.id, toHold.id],
      ]);
      await sql(`UPDATE user_coupon SET status = 'UNUSED', locked_until = NULL WHERE id = ?`, [toRelease.id]);
      const answers = await Promise.all([
        request(t.url).post(`/admin/user-coupons/${toVoid.id}/void`).set(admin()).send({ reason: 'contract' }),
        request(t.url)
          .post('/redemptions')
          .set(user)
          .send({ userCouponId: toRedeem.id, orderNo: newKey('ORD'), orderAmountCents: 20_000 }),
        request(t.url)
          .post('/redemptions/holds')
          .set(user)
          .send({ userCouponId: toHold.id, orderNo: newKey('ORD'), orderAmountCents: 20_000 }),
        request(t.url).post('/redemptions/holds/release').set(user).send({ userCouponId: toRelease.id, orderNo: order }),
      ]);
      expect(answers.map((r) => [r.status, r.body.code])).toEqual(Array.from({ length: 4 }, () => [409, 'STATUS_CONFLICT']));
    });

    it('403 FORBIDDEN: a user releasing a hold in the name of another user', async () => {
      const res = await request(t.url)
        .post('/redemptions/holds/release')
        .set(bearer(tokenFor('me')))
        .send({ userCouponId: '1', orderNo: 'ORD-1', userId: 'someone-else' });
      expect([res.status, res.body.code]).toEqual([403, 'FORBIDDEN']);
    });

    it('409 INSUFFICIENT_STOCK: approving a stock removal larger than the remaining stock; 409 COMPENSATION_ALREADY_DECIDED: deciding it again', async () => {
      // Two issued, init_stock 10, stock 11: three units too many, proposed for removal.
      const coupon = await createCoupon(t.url, { totalStock: 10 });
      await Promise.all(['is-1', 'is-2'].map((u) => grabUserCoupon(t.url, coupon.id, u)));
      await sql(`UPDATE coupon_stock SET stock = 11 WHERE coupon_id = ?`, [coupon.id]);
      const [compensation] = await compensationsFor(coupon.id);
      expect(compensation.action).toBe('REMOVE_STOCK');
      // Then the stock shrinks to two, the excess unchanged (as grabs would leave it): three cannot come off.
      await sql(`UPDATE coupon_stock SET init_stock = 1, stock = 2 WHERE coupon_id = ?`, [coupon.id]);
      const decide = (how: string) =>
        request(t.url).post(`/admin/compensations/${compensation.id}/${how}`).set(admin()).send({ reason: 'contract' });
      const approved = await decide('approve');
      expect([approved.status, approved.body.code]).toEqual([409, 'INSUFFICIENT_STOCK']);
      expect((await decide('reject')).status).toBe(200);
      const again = await decide('reject');
      expect([again.status, again.body.code]).toEqual([409, 'COMPENSATION_ALREADY_DECIDED']);
      await sql(`UPDATE coupon_stock SET init_stock = 10, stock = 8 WHERE coupon_id = ?`, [coupon.id]);
    });

    it('409 IDEMPOTENCY_IN_PROGRESS: a bulk issuance with the key of an upload still arriving', async () => {
      const coupon = await createCoupon(t.url, { totalStock: 10 });
      const key = newKey('upload');
      const head = headLines('POST', `/admin/coupons/${coupon.id}/issuances?reason=contract&fromStock=false`, {
        Authorization: `Bearer ${adminToken()}`,
        'Content-Type': 'text/csv',
        'Content-Length': 1000,
        'Idempotency-Key': key,
      });
      const socket = connect(Number(new URL(t.url).port), '127.0.0.1', () => socket.write(`${head}user_id\nalice\n`));
      socket.on('error', () => undefined);
      try {
        let rows: unknown[] = [];
        for (let i = 0; i < 500 && rows.length === 0; i++) {
          await new Promise((r) => setTimeout(r, 20));
          rows = (await sql(`SELECT id FROM issuance_job WHERE idempotency_key = ?`, [key])) as unknown[];
        }
        expect(rows).toHaveLength(1);
        const repeat = await request(t.url)
          .post(`/admin/coupons/${coupon.id}/issuances`)
          .set(admin())
          .set('Idempotency-Key', key)
          .send({ userIds: ['alice'], reason: 'contract', fromStock: false });
        expect([repeat.status, repeat.body.code]).toEqual([409, 'IDEMPOTENCY_IN_PROGRESS']);
      } finally {
        socket.destroy();
      }
    });
  });

  it('a request that arrives while the instance shuts down is 503 SERVICE_UNAVAILABLE, Retry-After: 1, Connection: close on every operation', async () => {
    const closing = await startTestApp({ REQUEST_TIMEOUT_MS: String(DEADLINE_MS), METRICS_TOKEN });
    const server = closing.app.getHttpServer();
    const port = Number(new URL(closing.url).port);
    // In flight (its body never ends) until its deadline, so the server drains rather than closes at once.
    const inFlight = connect(port, '127.0.0.1');
    inFlight.on('error', () => undefined);
    inFlight.write(headLines('POST', '/redemptions', { 'Content-Type': 'application/json', 'Content-Length': 2 }) + '{');
    // Each request's headers but their last line end: each request arrives once the server is closing.
    let arrive = (_bytes: string) => {};
    const end = new Promise<string>((resolve) => (arrive = resolve));
    const answers = OPS.map((op) => {
      const token = tokenOf(op);
      const head = headLines(op.method, pathOf(op) + (QUERY[name(op)] ?? ''), token ? { Authorization: `Bearer ${token}` } : {});
      return raw(closing.url, head.slice(0, -2), '', DEADLINE_MS * 4, end);
    });
    const open = () => new Promise<number>((resolve, reject) => server.getConnections((err, n) => (err ? reject(err) : resolve(n))));
    for (let i = 0; (await open()) < OPS.length + 1; i++) {
      if (i > 400) throw new Error('the connections were never all accepted');
      await new Promise((r) => setTimeout(r, 25));
    }
    const closed = closing.close();
    // Closing: Nest's shutdown hooks have run, and the server no longer listens.
    for (let i = 0; server.listening; i++) {
      if (i > 400) throw new Error('the server never started closing');
      await new Promise((r) => setTimeout(r, 25));
    }
    arrive('\r\n');
    const seen = (await Promise.all(answers)).map(({ status, headers, body }, i) => [
      name(OPS[i]),
      status,
      JSON.parse(body).code,
      headers['retry-after'],
      headers.connection,
      /^[0-9a-f-]{36}$/.test(headers['x-request-id']),
    ]);
    inFlight.destroy();
    await closed;
    expect(seen).toEqual(OPS.map((op) => [name(op), 503, 'SERVICE_UNAVAILABLE', '1', 'close', true]));
  }, 60_000);

  describe('with the database out of reach', () => {
    const admin = () => bearer(adminToken());
    /** For each write, a request that would succeed: it reaches its COMMIT. */
    const writes: Record<string, () => request.Test> = {};

    beforeAll(async () => {
      // One compensation to approve, one to reject.
      const gaps = await Promise.all([createCoupon(t.url, { totalStock: 10 }), createCoupon(t.url, { totalStock: 10 })]);
      for (const c of gaps) await t.db.query(`UPDATE coupon_stock SET stock = stock - 2 WHERE coupon_id = ?`, [c.id]);
      const [approve, reject] = (await compensationsFor(...gaps.map((c) => c.id))).map((c) => c.id);

      const [source, grabbed, patched, stocked, reissued, bulk, queued] = await Promise.all(
        Array.from({ length: 7 }, () => createCoupon(t.url, { totalStock: 50, perUserLimit: 5, returnOnRefund: true })),
      );
      const [toRedeem, toHold, toRelease, toRefund, toVoid] = await Promise.all(
        ['o-redeem', 'o-hold', 'o-release', 'o-refund', 'o-void'].map((user) => grabUserCoupon(t.url, source.id, user)),
      );
      const releaseOrder = newKey('ORD');
      expect(
        (
          await request(t.url)
            .post('/redemptions/holds')
            .set(bearer(tokenFor('o-release')))
            .send({ userCouponId: toRelease.id, orderNo: releaseOrder, orderAmountCents: 20_000 })
        ).status,
      ).toBe(201);
      const refunded = await redeemUserCoupon(t.url, toRefund.id, 'o-refund');
      const job = await request(t.url)
        .post(`/admin/coupons/${queued.id}/issuances`)
        .set(admin())
        .set('Idempotency-Key', newKey('job'))
        .send({ userIds: ['o-queued'], reason: 'contract', fromStock: false });
      expect(job.status).toBe(202);
      const hooks = await Promise.all(
        ['a', 'b'].map((p) =>
          request(t.url)
            .post('/admin/webhooks')
            .set(admin())
            .send({ url: `https://hooks.example.org/${p}` }),
        ),
      );
      const [patchedHook, deletedHook] = hooks.map((h) => h.body.id as string);

      const user = (id: string) => bearer(tokenFor(id));
      Object.assign(writes, {
        'POST /coupons/{couponId}/grab': () =>
          request(t.url).post(`/coupons/${grabbed.id}/grab`).set(user('o-grab')).set('Idempotency-Key', newKey('grab')),
        'POST /redemptions': () =>
          request(t.url)
            .post('/redemptions')
            .set(user('o-redeem'))
            .send({ userCouponId: toRedeem.id, orderNo: newKey('ORD'), orderAmountCents: 20_000 }),
        'POST /redemptions/holds': () =>
          request(t.url)
            .post('/redemptions/holds')
            .set(user('o-hold'))
            .send({ userCouponId: toHold.id, orderNo: newKey('ORD'), orderAmountCents: 20_000 }),
        'POST /redemptions/holds/release': () =>
          request(t.url)
            .post('/redemptions/holds/release')
            .set(user('o-release'))
            .send({ userCouponId: toRelease.id, orderNo: releaseOrder }),
        'POST /redemptions/refunds': () =>
          request(t.url)
            .post('/redemptions/refunds')
            .set(bearer(serviceToken()))
            .send({ userCouponId: toRefund.id, orderNo: refunded.orderNo, refundNo: newKey('RF') }),
        'POST /admin/coupons': () => request(t.url).post('/admin/coupons').set(admin()).send(couponBody()),
        'PATCH /admin/coupons/{couponId}': () =>
          request(t.url).patch(`/admin/coupons/${patched.id}`).set(admin()).send({ status: 'PAUSED' }),
        'POST /admin/coupons/{couponId}/stock': () =>
          request(t.url).post(`/admin/coupons/${stocked.id}/stock`).set(admin()).send({ delta: 5 }),
        'POST /admin/user-coupons/{userCouponId}/void': () =>
          request(t.url).post(`/admin/user-coupons/${toVoid.id}/void`).set(admin()).send({ reason: 'contract' }),
        'POST /admin/user-coupons/reissue': () =>
          request(t.url)
            .post('/admin/user-coupons/reissue')
            .set(admin())
            .send({ couponId: reissued.id, userId: 'o-reissue', reason: 'contract', fromStock: false }),
        [RUN]: () => request(t.url).post('/admin/reconciliation/runs').set(admin()).send({ mode: 'FULL' }),
        'POST /admin/compensations/{id}/approve': () =>
          request(t.url).post(`/admin/compensations/${approve}/approve`).set(admin()).send({ reason: 'contract' }),
        'POST /admin/compensations/{id}/reject': () =>
          request(t.url).post(`/admin/compensations/${reject}/reject`).set(admin()).send({ reason: 'contract' }),
        'POST /admin/coupons/{couponId}/issuances': () =>
          request(t.url)
            .post(`/admin/coupons/${bulk.id}/issuances`)
            .set(admin())
            .set('Idempotency-Key', newKey('bulk'))
            .send({ userIds: ['o-bulk'], reason: 'contract', fromStock: false }),
        'POST /admin/issuance-jobs/{jobId}/cancel': () => request(t.url).post(`/admin/issuance-jobs/${job.body.jobId}/cancel`).set(admin()),
        'POST /admin/webhooks': () => request(t.url).post('/admin/webhooks').set(admin()).send({ url: 'https://hooks.example.org/c' }),
        'PATCH /admin/webhooks/{webhookId}': () =>
          request(t.url).patch(`/admin/webhooks/${patchedHook}`).set(admin()).send({ enabled: false }),
        'DELETE /admin/webhooks/{webhookId}': () => request(t.url).delete(`/admin/webhooks/${deletedHook}`).set(admin()),
        'POST /admin/webhooks/{webhookId}/redeliver': () =>
          request(t.url).post(`/admin/webhooks/${patchedHook}/redeliver`).set(admin()).send({}),
      });
    });

    /** Sends the requests with the COMMITs planned, new database connections refused (the resolver's), and collects status and code. */
    async function lostCommits(plan: Partial<typeof commits>, ops: string[]): Promise<[string, number, string][]> {
      Object.assign(commits, plan);
      proxy.refusing = true;
      try {
        return await Promise.all(
          ops.map(async (op): Promise<[string, number, string]> => {
            const res = await writes[op]();
            return [op, res.status, res.body.code];
          }),
        );
      } finally {
        Object.assign(commits, { next: [], rest: 'pass' });
        proxy.refusing = false;
      }
    }

    it('a write whose COMMIT is lost, the database then unreachable past OUTCOME_RESOLVE_MS, is 503 OUTCOME_UNKNOWN on every write', async () => {
      const outcomeOps = OPS.filter((op) => documents(op, 503, 'OUTCOME_UNKNOWN')).map(name);
      // A write operation added to the document needs its request here.
      expect(Object.keys(writes).sort()).toEqual(outcomeOps.sort());
      // Starting a run commits its lease first (a lost answer there is SERVICE_UNAVAILABLE: not the run's write), then the run.
      const others = outcomeOps.filter((op) => op !== RUN);
      const answers = await lostCommits({ rest: 'drop' }, others);
      expect(answers).toEqual(others.map((op) => [op, 503, 'OUTCOME_UNKNOWN']));
      expect(await lostCommits({ next: ['pass', 'drop'] }, [RUN])).toEqual([[RUN, 503, 'OUTCOME_UNKNOWN']]);
      expect(proxy.commits.drop).toBeGreaterThanOrEqual(outcomeOps.length);
    });

    it('every operation that uses the database is 503 SERVICE_UNAVAILABLE while it is unreachable, and answers again once it is back', async () => {
      // Every operation documents 503 SERVICE_UNAVAILABLE (a shutting-down instance answers it on any route); these reach the database.
      const dbOps = OPS.filter((op) => ROUTES[name(op)].usesDatabase !== false);
      const port = proxy.port;
      await proxy.close();
      let answers: [string, number, string][];
      try {
        answers = await Promise.all(
          dbOps.map(async (op): Promise<[string, number, string]> => {
            const res = await valid(op);
            return [name(op), res.status, res.body.code];
          }),
        );
      } finally {
        proxy = await startTcpProxy(real, { onCommit, port });
      }
      expect(answers).toEqual(dbOps.map((op) => [name(op), 503, 'SERVICE_UNAVAILABLE']));
      let health = 0;
      for (let i = 0; i < 50 && health !== 200; i++) {
        health = (await request(t.url).get('/health')).status;
        if (health !== 200) await new Promise((r) => setTimeout(r, 100));
      }
      expect(health).toBe(200);
    });
  });
});
