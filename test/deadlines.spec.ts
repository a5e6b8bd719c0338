import { jest } from '@jest/globals';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import mysql2 from 'mysql2';
import mysql from 'mysql2/promise';
import pino from 'pino';
import request from 'supertest';
import { couponBody, createCoupon, newKey } from './support/factories.js';
import {
  adminToken,
  bearer,
  createTestDatabase,
  dropTestDatabase,
  startTestApp,
  TestApp,
  testConfig,
  tokenFor,
} from './support/harness.js';
import { loadConfig } from '../src/config/app-config.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { deadlineDriver, runWithDeadline } from '../src/database/deadline-pool.js';
import { startStallProxy, StallProxy } from './support/stall-proxy.js';

/**
 * Issue 23 item 3: every request has a deadline (REQUEST_TIMEOUT_MS). A client that sends its
 * request too slowly is answered 408; a database that stops answering (a stalled proxy standing
 * for a SIGSTOPped server) ends every request in 503 within the deadline, and the service recovers
 * when it answers again.
 */

const DEADLINE_MS = 3000;
/** Scheduling slack on a loaded 2-core machine, on top of the deadline. */
const SLACK_MS = 2500;

const LIMITS = {
  REQUEST_TIMEOUT_MS: String(DEADLINE_MS),
  DB_STATEMENT_TIMEOUT_MS: '1500',
  DB_ACQUIRE_TIMEOUT_MS: '1000',
  DB_POOL_SIZE: '4',
  COUPON_CACHE_TTL_MS: '0',
};

interface RawAnswer {
  text: string;
  elapsedMs: number;
  /** The server closed the connection after answering. */
  closed: boolean;
}

/** Writes `head` at once, then each of `drip` one every `everyMs`, and collects what comes back until the server closes or `maxMs` passes. */
function trickle(url: string, head: string, drip: string[], everyMs: number, maxMs: number): Promise<RawAnswer> {
  const port = Number(new URL(url).port);
  return new Promise((resolve) => {
    const started = Date.now();
    let text = '';
    let answeredAt = 0;
    const socket = connect(port, '127.0.0.1', () => socket.write(head));
    const dripper = setInterval(() => {
      const next = drip.shift();
      if (next !== undefined && socket.writable) socket.write(next);
    }, everyMs);
    const finish = (closed: boolean) => {
      clearInterval(dripper);
      clearTimeout(giveUp);
      socket.destroy();
      resolve({ text, elapsedMs: (answeredAt || Date.now()) - started, closed });
    };
    const giveUp = setTimeout(() => finish(false), maxMs);
    socket.on('data', (c) => {
      if (!answeredAt) answeredAt = Date.now();
      text += c.toString();
    });
    socket.on('close', () => finish(true));
    socket.on('error', () => undefined);
  });
}

/** The head of a POST /admin/coupons framed by `framing` (a length or chunked), and the start of its body. */
const adminPost = (framing: string, first: string) =>
  [
    'POST /admin/coupons HTTP/1.1',
    'Host: localhost',
    `Authorization: Bearer ${adminToken()}`,
    'Content-Type: application/json',
    framing,
    '',
    first,
  ].join('\r\n');

/** A bulk upload's path, and a head declaring 10,000 bytes of `type` followed by the first of them. */
function bulkUpload(couponId: string, type: string, key: string, first: string) {
  const path = `/admin/coupons/${couponId}/issuances?reason=r&fromStock=false`;
  const head = [
    `POST ${path} HTTP/1.1`,
    'Host: localhost',
    `Authorization: Bearer ${adminToken()}`,
    `Content-Type: ${type}`,
    `Idempotency-Key: ${key}`,
    'Content-Length: 10000',
    '',
    first,
  ].join('\r\n');
  return { path, head };
}

/** The upload of `key` sent again, whole: a CSV of two users. */
const sendAgain = (url: string, path: string, key: string) =>
  request(url).post(path).set(bearer(adminToken())).set('Idempotency-Key', key).set('Content-Type', 'text/csv').send('u-1\nu-2\n');

const bodyOf = (raw: string) => JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4).replace(/^[0-9a-f]+\r\n/, '')) as { code: string };

describe('deadlines: slow clients', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(LIMITS);
  });
  afterAll(async () => {
    await t.close();
  });

  it('a body sent one byte a second is cut off at the deadline with 408 REQUEST_TIMEOUT in the error format', async () => {
    const body = JSON.stringify({ userCouponId: '1', orderNo: 'slow-1', orderAmountCents: 100 });
    const head = [
      'POST /redemptions HTTP/1.1',
      'Host: localhost',
      `Authorization: Bearer ${tokenFor('slow-body')}`,
      'Content-Type: application/json',
      'X-Request-Id: slow-body-1',
      `Content-Length: ${body.length}`,
      '',
      '',
    ].join('\r\n');
    const answer = await trickle(t.url, head, body.split(''), 1000, DEADLINE_MS * 4);
    expect(answer.text).toMatch(/^HTTP\/1\.1 408 /);
    expect(answer.text).toMatch(/\r\nx-request-id: slow-body-1\r\n/i);
    expect(bodyOf(answer.text).code).toBe('REQUEST_TIMEOUT');
    expect(answer.elapsedMs).toBeGreaterThanOrEqual(DEADLINE_MS - 100);
    expect(answer.elapsedMs).toBeLessThan(DEADLINE_MS + SLACK_MS);
    expect(answer.closed).toBe(true);
  });

  it('a body refused on its length gets its 413 at once, and the rest, sent one piece a second, is cut off at the deadline', async () => {
    const head = adminPost(`Content-Length: ${1024 * 1024}`, '{"name":"');
    const started = Date.now();
    const answer = await trickle(t.url, head, Array(30).fill('x'.repeat(100)), 1000, DEADLINE_MS * 4);
    expect(answer.text).toMatch(/^HTTP\/1\.1 413 /);
    expect(answer.elapsedMs).toBeLessThan(SLACK_MS);
    // Read and dropped, for as long again as the route gives a request: not Node's requestTimeout.
    expect(answer.closed).toBe(true);
    expect(Date.now() - started).toBeGreaterThanOrEqual(DEADLINE_MS - 100);
    expect(Date.now() - started).toBeLessThan(DEADLINE_MS + SLACK_MS);
  });

  it('a refused body whose rest breaks the chunked framing gets its one answer, then the connection closes', async () => {
    const head = adminPost('Transfer-Encoding: chunked', `${(70 * 1024).toString(16)}\r\n${'x'.repeat(70 * 1024)}\r\n`);
    const started = Date.now();
    const answer = await trickle(t.url, head, ['not a chunk size\r\n'], 500, DEADLINE_MS * 2);
    expect(answer.text).toMatch(/^HTTP\/1\.1 413 /);
    expect(answer.text.match(/HTTP\/1\.1 /g)).toHaveLength(1);
    // Closed for the bad line sent half a second after the answer, not with the answer.
    expect(answer.closed).toBe(true);
    expect(Date.now() - started).toBeGreaterThanOrEqual(450);
  });

  it('headers sent one line a second are cut off with 408 REQUEST_TIMEOUT', async () => {
    const drip = Array.from({ length: 30 }, (_, i) => `X-Slow-${i}: 1\r\n`);
    const answer = await trickle(t.url, 'GET /coupons/1 HTTP/1.1\r\nHost: localhost\r\n', drip, 1000, DEADLINE_MS * 4);
    expect(answer.text).toMatch(/^HTTP\/1\.1 408 /);
    expect(bodyOf(answer.text).code).toBe('REQUEST_TIMEOUT');
    // Node checks its header deadline once a second.
    expect(answer.elapsedMs).toBeLessThan(DEADLINE_MS + 1000 + SLACK_MS);
    expect(answer.closed).toBe(true);
  });

  it.each([
    ['text/csv', 'u-1\n', (i: number) => `u-${i + 2}\n`],
    ['application/json', '{"reason":"r","fromStock":false,"userIds":["u-1"', (i: number) => `,"u-${i + 2}"`],
  ])(
    'a bulk upload (%s) cut off by its deadline frees its Idempotency-Key at once: the same key then makes the job; nothing is logged',
    async (type, first, next) => {
      const bulk = await startTestApp({ ...LIMITS, BULK_UPLOAD_TIMEOUT_MS: '2000' });
      // Every logger of the app, request loggers included, writes to its root's stream.
      const stream = Reflect.get(bulk.app.getHttpAdapter().getInstance().log, pino.symbols.streamSym) as { write(line: string): boolean };
      const logged = jest.spyOn(stream, 'write');
      try {
        const coupon = await createCoupon(bulk.url, { totalStock: 10 });
        const key = newKey('slow-upload');
        const { path, head } = bulkUpload(coupon.id, type, key, first);
        const answer = await trickle(
          bulk.url,
          head,
          Array.from({ length: 20 }, (_, i) => next(i)),
          500,
          10_000,
        );
        expect(answer.text).toMatch(/^HTTP\/1\.1 408 /);
        expect(bodyOf(answer.text).code).toBe('REQUEST_TIMEOUT');
        expect(answer.closed).toBe(true);
        // The upload is discarded once the connection is gone, so the key is free for the client's retry.
        let retry: request.Response | undefined;
        for (const started = Date.now(); Date.now() - started < 5000; await sleep(250)) {
          retry = await sendAgain(bulk.url, path, key);
          if (retry.status !== 409) break;
        }
        expect([retry?.status, retry?.body.code]).toEqual([202, undefined]);
        // Nothing at the test's warn level (the request log writes a 4xx at info): no warning of a
        // second answer to a request whose body failed after its 408, as Fastify's JSON reader gave.
        expect(logged.mock.calls.map(([line]) => JSON.parse(line) as object)).toEqual([]);
      } finally {
        logged.mockRestore();
        await bulk.close();
      }
    },
    30_000,
  );

  it.each([
    ['text/csv', 'u-1\nu-2'],
    ['application/json', '{"reason":"r","fromStock":false,"userIds":["u-1"'],
  ])(
    'a bulk upload (%s) that stops arriving is answered 408 when its connection has been silent twice the deadline, not closed without a word; its key is then free',
    async (type, first) => {
      const coupon = await createCoupon(t.url, { totalStock: 10 });
      const key = newKey('stalled-upload');
      const { path, head } = bulkUpload(coupon.id, type, key, first);
      const answer = await trickle(t.url, head, [], 1000, DEADLINE_MS * 4);
      expect(answer.text).toMatch(/^HTTP\/1\.1 408 /);
      expect(bodyOf(answer.text).code).toBe('REQUEST_TIMEOUT');
      expect(answer.closed).toBe(true);
      // Node's connectionTimeout (twice REQUEST_TIMEOUT_MS of silence), long before the route's 600 s.
      expect(answer.elapsedMs).toBeGreaterThanOrEqual(2 * DEADLINE_MS - 100);
      expect(answer.elapsedMs).toBeLessThan(2 * DEADLINE_MS + SLACK_MS);
      const retry = await sendAgain(t.url, path, key);
      expect([retry.status, retry.body.code]).toEqual([202, undefined]);
    },
    30_000,
  );

  it('a CSV declaring more than 64 MiB is 413 before a byte of it is read', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const head = [
      `POST /admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false HTTP/1.1`,
      'Host: localhost',
      `Authorization: Bearer ${adminToken()}`,
      'Content-Type: text/csv',
      `Idempotency-Key: ${newKey('huge')}`,
      `Content-Length: ${100_000_000}`,
      '',
      'u-1\n',
    ].join('\r\n');
    const answer = await trickle(t.url, head, [], 1000, DEADLINE_MS * 4);
    expect(answer.text).toMatch(/^HTTP\/1\.1 413 /);
    expect(bodyOf(answer.text).code).toBe('PAYLOAD_TOO_LARGE');
    expect(answer.elapsedMs).toBeLessThan(SLACK_MS);
    expect(answer.closed).toBe(true);
  });

  it('a server closing drops the refused bodies still arriving at once, rather than waiting up to their deadline (the bulk route: 600 s)', async () => {
    const closing = await startTestApp(LIMITS);
    let closedIn: number | undefined;
    const socket = connect(Number(new URL(closing.url).port), '127.0.0.1');
    socket.on('error', () => undefined);
    try {
      const coupon = await createCoupon(closing.url);
      const head = [
        `POST /admin/coupons/${coupon.id}/issuances HTTP/1.1`,
        'Host: localhost',
        `Authorization: Bearer ${adminToken()}`,
        'Content-Type: text/plain',
        'Content-Length: 100000',
        '',
        'x',
      ].join('\r\n');
      socket.write(head);
      const answered = new Promise<string>((resolve) => socket.once('data', (c: Buffer) => resolve(c.toString())));
      const dripper = setInterval(() => socket.writable && socket.write('x'.repeat(100)), 200);
      try {
        expect(await answered).toMatch(/^HTTP\/1\.1 415 /);
        const started = Date.now();
        await closing.app.close();
        closedIn = Date.now() - started;
      } finally {
        clearInterval(dripper);
      }
    } finally {
      socket.destroy();
      if (closedIn === undefined) await closing.app.close();
      await closing.db.destroy();
      await dropTestDatabase(closing.config);
    }
    // Its drain would have lasted the bulk route's deadline (600 s); the rest is the app's own close.
    expect(closedIn).toBeLessThan(5_000);
  }, 30_000);

  it('a request answered while the server closes gets Connection: close, so its client does not send the next one on it', async () => {
    const closing = await startTestApp(LIMITS);
    const socket = connect(Number(new URL(closing.url).port), '127.0.0.1');
    socket.on('error', () => undefined);
    let closed: Promise<void> | undefined;
    try {
      const body = JSON.stringify(couponBody());
      socket.write(
        [
          'POST /admin/coupons HTTP/1.1',
          'Host: localhost',
          `Authorization: Bearer ${adminToken()}`,
          'Content-Type: application/json',
          `Content-Length: ${body.length}`,
          '',
          body.slice(0, 10),
        ].join('\r\n'),
      );
      await sleep(200);
      // The request is in flight (its body still arriving) when the close begins.
      closed = closing.app.close();
      await sleep(200);
      const answered = new Promise<string>((resolve) => socket.once('data', (c: Buffer) => resolve(c.toString())));
      socket.write(body.slice(10));
      const answer = await answered;
      expect(answer).toMatch(/^HTTP\/1\.1 201 /);
      expect(answer).toMatch(/\r\nconnection: close\r\n/i);
    } finally {
      socket.destroy();
      await (closed ?? closing.app.close());
      await closing.db.destroy();
      await dropTestDatabase(closing.config);
    }
  }, 30_000);

  it('a connection that sends nothing is closed by the deadline', async () => {
    const answer = await trickle(t.url, '', [], 1000, DEADLINE_MS * 4);
    expect(answer.closed).toBe(true);
    expect(answer.elapsedMs).toBeLessThan(DEADLINE_MS + 1000 + SLACK_MS);
  });

  it('REQUEST_TIMEOUT_MS and the database limits are validated at boot', () => {
    expect(loadConfig({}).REQUEST_TIMEOUT_MS).toBe(10_000);
    expect(() => testConfig({ REQUEST_TIMEOUT_MS: '0' })).toThrow(/REQUEST_TIMEOUT_MS/);
    expect(() => testConfig({ DB_LOCK_WAIT_TIMEOUT_SECONDS: '0' })).toThrow(/DB_LOCK_WAIT_TIMEOUT_SECONDS/);
    expect(() => testConfig({ DB_STATEMENT_TIMEOUT_MS: 'soon' })).toThrow(/DB_STATEMENT_TIMEOUT_MS/);
  });
});

describe('deadlines: a stalled database', () => {
  let proxy: StallProxy;
  let t: TestApp;
  let direct: ReturnType<typeof testConfig>;
  beforeAll(async () => {
    direct = testConfig(LIMITS);
    proxy = await startStallProxy({ host: direct.DB_HOST, port: direct.DB_PORT });
    const config = testConfig({ ...LIMITS, DB_NAME: direct.DB_NAME, DB_HOST: '127.0.0.1', DB_PORT: String(proxy.port) });
    await createTestDatabase(config);
    t = await startTestApp({}, config);
  });
  afterAll(async () => {
    proxy.resume();
    await t.close();
    await proxy.close();
    await dropTestDatabase(direct);
  });

  /** A request with a client-side limit well past the deadline: a hang shows as status 0. */
  const timed = async (make: () => request.Test) => {
    const started = Date.now();
    try {
      const res = await make().timeout(DEADLINE_MS * 3);
      return { status: res.status, code: res.body?.code as string | undefined, ms: Date.now() - started };
    } catch {
      return { status: 0, code: 'HUNG', ms: Date.now() - started };
    }
  };

  it('every request in flight or arriving while it is stalled ends in 503 SERVICE_UNAVAILABLE within the deadline; nothing answered 503 was committed; it recovers', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 1000, perUserLimit: 1 });
    const warm = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor('stall-0')))
      .set('Idempotency-Key', newKey());
    expect(warm.status).toBe(201);

    proxy.stall();
    const keys = Array.from({ length: 16 }, (_, i) => ({ user: `stall-${i + 1}`, key: newKey('stall') }));
    const firstWave = [
      ...keys.map(({ user, key }) =>
        timed(() =>
          request(t.url)
            .post(`/coupons/${coupon.id}/grab`)
            .set(bearer(tokenFor(user)))
            .set('Idempotency-Key', key),
        ),
      ),
      ...Array.from({ length: 4 }, () => timed(() => request(t.url).get(`/coupons/${coupon.id}`))),
      ...Array.from({ length: 4 }, (_, i) =>
        timed(() =>
          request(t.url)
            .get('/me/coupons')
            .set(bearer(tokenFor(`stall-${i}`))),
        ),
      ),
    ];
    // Requests that arrive after the pool is already stuck wait for a connection, not for a statement.
    await new Promise((r) => setTimeout(r, 700));
    const secondWave = Array.from({ length: 4 }, () => timed(() => request(t.url).get(`/coupons/${coupon.id}`)));
    const answers = await Promise.all([...firstWave, ...secondWave]);
    const health = await timed(() => request(t.url).get('/health'));
    proxy.resume();

    for (const a of answers) {
      expect([a.status, a.code]).toEqual([503, 'SERVICE_UNAVAILABLE']);
      expect(a.ms).toBeLessThan(DEADLINE_MS + SLACK_MS);
    }
    expect(health.status).toBe(503);

    // Back: the service answers again without a restart, and no grab answered 503 issued a coupon.
    let again = { status: 0 };
    for (let i = 0; i < 50 && again.status !== 200; i++) {
      again = await request(t.url).get(`/coupons/${coupon.id}`);
      if (again.status !== 200) await new Promise((r) => setTimeout(r, 200));
    }
    expect(again.status).toBe(200);
    const after = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor('stall-after')))
      .set('Idempotency-Key', newKey());
    expect(after.status).toBe(201);
    for (const { user, key } of keys) {
      const lookup = await request(t.url)
        .get(`/grabs/${key}`)
        .set(bearer(tokenFor(user)));
      expect([user, lookup.status]).toEqual([user, 404]);
    }
    expect(await checkInvariants(t.db)).toEqual([]);
  });
});

describe('deadlines: a connection lost under a statement', () => {
  it('answers the statement once, with the connection lost, and leaves no timer to call back again at its timeout', async () => {
    const TIMEOUT_MS = 2000;
    const c = testConfig({ DB_STATEMENT_TIMEOUT_MS: String(TIMEOUT_MS) });
    const server = { host: c.DB_HOST, port: c.DB_PORT, user: c.DB_USER, password: c.DB_PASSWORD };
    const pool = deadlineDriver(mysql2, c).createPool({ ...server, connectionLimit: 1 });
    const killer = mysql2.createConnection(server).promise();
    try {
      await killer.query('SELECT 1');
      const conn = await new Promise<mysql2.PoolConnection>((resolve, reject) =>
        pool.getConnection((err, got) => (err ? reject(err) : resolve(got))),
      );
      conn.on('error', () => undefined);
      const answers: (string | undefined)[] = [];
      let first!: () => void;
      const answered = new Promise<void>((resolve) => (first = resolve));
      const started = Date.now();
      const statement = conn.query('SELECT SLEEP(10)', (err: NodeJS.ErrnoException | null) => {
        answers.push(err?.code);
        first();
      }) as unknown as { queryTimeout: NodeJS.Timeout | null };
      await sleep(200);
      await killer.query(`KILL CONNECTION ${conn.threadId}`);
      await answered;
      expect(answers).toEqual(['PROTOCOL_CONNECTION_LOST']);
      // mysql2's timer for the statement: left running, it keeps the process alive and answers again.
      expect(statement.queryTimeout ? 'running' : 'cleared').toBe('cleared');
      await sleep(Math.max(0, started + TIMEOUT_MS + 300 - Date.now()));
      expect(answers).toEqual(['PROTOCOL_CONNECTION_LOST']);
    } finally {
      await killer.end();
      await new Promise((resolve) => pool.end(resolve));
    }
  });
});

describe("deadlines: one request's deadline is its own", () => {
  it('a request queued for a connection is not held to the deadline of the one whose timed-out connection made room for it', async () => {
    const c = testConfig({ DB_STATEMENT_TIMEOUT_MS: '5000', DB_ACQUIRE_TIMEOUT_MS: '5000' });
    const server = { host: c.DB_HOST, port: c.DB_PORT, user: c.DB_USER, password: c.DB_PASSWORD };
    const pool = deadlineDriver(mysql2, c).createPool({ ...server, connectionLimit: 1 });
    const connection = () =>
      new Promise<mysql2.PoolConnection>((resolve, reject) => pool.getConnection((err, got) => (err ? reject(err) : resolve(got))));
    const query = (conn: mysql2.PoolConnection, sql: string) =>
      new Promise<unknown>((resolve, reject) => conn.query(sql, (err: unknown, rows: unknown) => (err ? reject(err) : resolve(rows))));
    try {
      // A: its statement outlives its deadline, and its connection is destroyed for it.
      const short = runWithDeadline({ at: Date.now() + 800, answered: false }, async () => {
        const conn = await connection();
        conn.on('error', () => undefined);
        return query(conn, 'SELECT SLEEP(5)').catch((err: NodeJS.ErrnoException) => err.code);
      });
      await sleep(100);
      // B: queued for the pool's one connection, with seconds left; it gets a new one when A's is destroyed.
      const long = runWithDeadline({ at: Date.now() + 10_000, answered: false }, async () => {
        const conn = await connection();
        try {
          return await query(conn, 'SELECT 1 AS one');
        } finally {
          conn.release();
        }
      });
      expect(await short).toBe('PROTOCOL_SEQUENCE_TIMEOUT');
      expect(await long).toEqual([{ one: 1 }]);
    } finally {
      await new Promise((resolve) => pool.end(resolve));
    }
  });
});

describe('deadlines: a bulk upload held up by the database', () => {
  const REQUEST_MS = 1000;
  let t: TestApp;
  beforeAll(async () => {
    // Node's connectionTimeout is twice REQUEST_TIMEOUT_MS: 2 s of a connection nobody reads.
    t = await startTestApp({ REQUEST_TIMEOUT_MS: String(REQUEST_MS), DB_STATEMENT_TIMEOUT_MS: '20000' });
  });
  afterAll(() => t.close());

  it('a CSV whose lines wait longer than the connection timeout for the database is stored, not answered 408: the silence was the server not reading', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    // A first batch of lines (the service writes 2,000 at a time), then enough blank lines that the
    // rest waits in the socket while that batch waits for the table.
    const ids = Array.from({ length: 2500 }, (_, i) => `held-${i}`);
    const body = Buffer.from(`${ids.join('\n')}\n${'\n'.repeat(2 * 1024 * 1024)}`);
    const lock = await t.db.createQueryRunner();
    await lock.connect();
    await lock.query('LOCK TABLES issuance_job_line WRITE');
    const held = 3 * REQUEST_MS;
    const unlock = sleep(held).then(() => lock.query('UNLOCK TABLES'));
    try {
      const started = Date.now();
      const res = await request(t.url)
        .post(`/admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false`)
        .set(bearer(adminToken()))
        .set('Idempotency-Key', newKey('held-upload'))
        .set('Content-Type', 'text/csv')
        .send(body);
      expect([res.status, res.body.code]).toEqual([202, undefined]);
      expect(Date.now() - started).toBeGreaterThanOrEqual(held - 100);
      const [{ n }] = (await t.db.query('SELECT COUNT(*) AS n FROM issuance_job_line WHERE job_id = ?', [res.body.jobId])) as {
        n: string;
      }[];
      expect(Number(n)).toBe(ids.length);
    } finally {
      await unlock;
      await lock.release();
    }
  }, 30_000);

  it('and one that stops arriving after such a wait is still answered 408 once its connection is silent again', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const ids = Array.from({ length: 2500 }, (_, i) => `cut-${i}`);
    // All of it fits in what Node reads before the service stops reading: no byte comes after the wait.
    const sent = `${ids.join('\n')}\n`;
    const key = newKey('held-then-stalled');
    const head = [
      `POST /admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false HTTP/1.1`,
      'Host: localhost',
      `Authorization: Bearer ${adminToken()}`,
      'Content-Type: text/csv',
      `Idempotency-Key: ${key}`,
      `Content-Length: ${sent.length + 1000}`,
      '',
      sent,
    ].join('\r\n');
    const lock = await t.db.createQueryRunner();
    await lock.connect();
    await lock.query('LOCK TABLES issuance_job_line WRITE');
    const unlock = sleep(3 * REQUEST_MS).then(() => lock.query('UNLOCK TABLES'));
    try {
      const answer = await trickle(t.url, head, [], 1000, 15_000);
      expect(answer.text).toMatch(/^HTTP\/1\.1 408 /);
      expect(bodyOf(answer.text).code).toBe('REQUEST_TIMEOUT');
      // The wait for the table (3 s), then a new silence of twice REQUEST_TIMEOUT_MS.
      expect(answer.elapsedMs).toBeGreaterThanOrEqual(5 * REQUEST_MS - 100);
    } finally {
      await unlock;
      await lock.release();
    }
  }, 30_000);
});

describe('deadlines: a session cut off by a network partition', () => {
  it.each([
    ['10', undefined],
    // 0 leaves the server's global value, set here to tell it from an explicit 0.
    ['37', '0'],
  ])(
    'on MariaDB, every serving connection has idle_transaction_timeout %s (DB_IDLE_TRANSACTION_TIMEOUT_SECONDS=%s; 0 leaves the global), and is READ COMMITTED',
    async (expected, setting) => {
      const c = testConfig(setting === undefined ? {} : { DB_IDLE_TRANSACTION_TIMEOUT_SECONDS: setting });
      const admin = await mysql.createConnection({ host: c.DB_HOST, port: c.DB_PORT, user: c.DB_USER, password: c.DB_PASSWORD });
      const [[global]] = (await admin.query('SELECT @@GLOBAL.idle_transaction_timeout AS g')) as unknown as [{ g: number }[]];
      if (setting === '0') await admin.query('SET GLOBAL idle_transaction_timeout = 37');
      const pool = deadlineDriver(mysql2, c).createPool({
        host: c.DB_HOST,
        port: c.DB_PORT,
        user: c.DB_USER,
        password: c.DB_PASSWORD,
        connectionLimit: 1,
      });
      try {
        const conn = await new Promise<mysql2.PoolConnection>((resolve, reject) =>
          pool.getConnection((err, got) => (err ? reject(err) : resolve(got))),
        );
        const rows = await new Promise<{ t: number; iso: string }[]>((resolve, reject) =>
          conn.query('SELECT @@SESSION.idle_transaction_timeout AS t, @@SESSION.tx_isolation AS iso', (err, r) =>
            err ? reject(err) : resolve(r as { t: number; iso: string }[]),
          ),
        );
        conn.release();
        expect(String(rows[0].t)).toBe(expected);
        // Set with the others, so the app's transactions need no SET TRANSACTION of their own.
        expect(rows[0].iso).toBe('READ-COMMITTED');
      } finally {
        await new Promise((resolve) => pool.end(resolve));
        await admin.query(`SET GLOBAL idle_transaction_timeout = ${Number(global.g)}`);
        await admin.end();
      }
    },
  );

  it('on MariaDB, its transaction is closed by the server after DB_IDLE_TRANSACTION_TIMEOUT_SECONDS, releasing its row locks', async () => {
    const c = testConfig({ DB_IDLE_TRANSACTION_TIMEOUT_SECONDS: '2' });
    await createTestDatabase(c);
    const server = { host: c.DB_HOST, port: c.DB_PORT, user: c.DB_USER, password: c.DB_PASSWORD, database: c.DB_NAME };
    const direct = mysql2.createConnection(server).promise();
    const proxy = await startStallProxy({ host: c.DB_HOST, port: c.DB_PORT });
    const pool = deadlineDriver(mysql2, c).createPool({ ...server, host: '127.0.0.1', port: proxy.port, connectionLimit: 1 });
    try {
      await direct.query('CREATE TABLE held (id INT PRIMARY KEY)');
      await direct.query('INSERT INTO held VALUES (1)');
      const conn = await new Promise<mysql2.PoolConnection>((resolve, reject) =>
        pool.getConnection((err, got) => (err ? reject(err) : resolve(got))),
      );
      conn.on('error', () => undefined);
      const send = (sql: string) => new Promise<void>((resolve, reject) => conn.query(sql, (err) => (err ? reject(err) : resolve())));
      await send('START TRANSACTION');
      await send('SELECT id FROM held WHERE id = 1 FOR UPDATE');
      // The partition: the service's side gives up on the connection, the server hears nothing.
      proxy.stall();
      const lockable = async () => {
        await direct.query('START TRANSACTION');
        try {
          await direct.query('SELECT id FROM held WHERE id = 1 FOR UPDATE NOWAIT');
          return true;
        } catch {
          return false;
        } finally {
          await direct.query('ROLLBACK');
        }
      };
      expect(await lockable()).toBe(false);
      await sleep(3500);
      expect(await lockable()).toBe(true);
      conn.destroy();
    } finally {
      proxy.resume();
      await new Promise((resolve) => pool.end(resolve));
      await proxy.close();
      await direct.end();
      await dropTestDatabase(c);
    }
  }, 20_000);
});
