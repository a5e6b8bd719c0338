// `npm start` stopped with SIGTERM, through npm's own process tree: the request in flight is
// answered, one that arrives while the server closes is refused 503 in the error format, the jobs
// stop, the pool closes, the process exits 0 and says so.
import { ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import mysql from 'mysql2/promise';
import { call, checkReply, sleep } from './faults/support/http.js';
import { BUILD_DIR, buildServer, ROOT, startServer } from './faults/support/server.js';
import { couponBody } from './support/factories.js';
import { adminToken, createTestDatabase, dropTestDatabase, TEST_SECRET, testConfig, tokenFor } from './support/harness.js';
import { freePort } from './support/net.js';

const config = testConfig();

/** Whether the server still accepts connections on `port`. */
const accepts = (port: number) =>
  new Promise<boolean>((ok) => {
    const socket = connect(port, '127.0.0.1', () => {
      socket.destroy();
      ok(true);
    });
    socket.on('error', () => ok(false));
  });
let child: ChildProcess | undefined;
let output = '';
let blocker: mysql.Connection | undefined;

beforeAll(async () => {
  await buildServer();
  await createTestDatabase(config);
}, 180_000);

afterAll(async () => {
  // The whole tree (npm, npm, node): npm does not pass SIGKILL on.
  if (child?.pid !== undefined && child.exitCode === null) process.kill(-child.pid, 'SIGKILL');
  await blocker?.end();
  await dropTestDatabase(config);
}, 60_000);

it('SIGTERM to npm start finishes the request in flight, refuses in the error format one arriving meanwhile, stops, closes the pool and logs it', async () => {
  // The project's own start scripts, in a directory whose dist/ is the private test build and whose
  // build step is a no-op: the process tree is exactly npm -> npm -> node.
  const scripts = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts;
  const dir = mkdtempSync(join(tmpdir(), 'ce-start-'));
  symlinkSync(BUILD_DIR, join(dir, 'dist'));
  writeFileSync(
    join(dir, 'package.json'),
    JSON.stringify({
      name: 'ce-start',
      private: true,
      type: 'module',
      scripts: { build: 'true', start: scripts.start, 'start:prod': scripts['start:prod'] },
    }),
  );
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  child = spawn('npm', ['start'], {
    cwd: dir,
    env: {
      PATH: process.env.PATH ?? '',
      HOME: process.env.HOME ?? tmpdir(),
      NODE_ENV: 'test',
      LOG_FORMAT: 'json',
      LOG_LEVEL: 'info',
      PORT: String(port),
      HOST: '127.0.0.1',
      DB_HOST: config.DB_HOST,
      DB_PORT: String(config.DB_PORT),
      DB_USER: config.DB_USER,
      DB_PASSWORD: config.DB_PASSWORD,
      DB_NAME: config.DB_NAME,
      DB_POOL_SIZE: '4',
      JWT_SECRET: TEST_SECRET,
      RATE_LIMIT_ENABLED: 'false',
      SCHEDULER_ENABLED: 'true',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<{ code: number | null; signal: string | null }>((ok) =>
    child?.once('exit', (code, signal) => ok({ code, signal })),
  );

  for (let i = 0; (await call(url, 'GET', '/health', { timeoutMs: 1000 })).status !== 200; i++) {
    if (i > 300 || child.exitCode !== null) throw new Error(`server did not start:\n${output}`);
    await sleep(100);
  }
  // /health answers a moment before the last start-up lines are written.
  for (let i = 0; !output.includes('"msg":"Listening on '); i++) {
    if (i > 100) throw new Error(`no "Listening on" line:\n${output}`);
    await sleep(50);
  }
  // It listens on HOST only: another loopback address of this machine finds nothing there.
  expect(output).toContain(`"msg":"Listening on 127.0.0.1:${port} (test)"`);
  expect((await call(`http://127.0.0.2:${port}`, 'GET', '/health', { timeoutMs: 1000 })).status).toBe(0);
  // Start-up says what it connected to, what it migrated and what it scheduled.
  expect(output).toMatch(/"msg":"Database ce_test_\w+ on 127\.0\.0\.1:\d+ as \w+, pool of 4; no migration pending"/);
  expect(output).toMatch(/"msg":"Job expire-user-coupons scheduled: /);
  // One line per request, with the route, the user and the code answered.
  const refused = await call(url, 'POST', '/coupons/424242/grab', { token: tokenFor('bob'), headers: { 'Idempotency-Key': 'k0' } });
  expect(refused.body.code).toBe('COUPON_NOT_FOUND');
  const requestLine = () => output.split('\n').find((l) => l.includes('"url":"/coupons/424242/grab"'));
  // Written once the answer is sent, so it may reach the pipe just after it.
  for (let i = 0; !requestLine() && i < 100; i++) await sleep(50);
  const line = requestLine();
  expect(JSON.parse(line ?? '{}')).toMatchObject({
    msg: 'request',
    method: 'POST',
    route: '/coupons/:couponId/grab',
    status: 404,
    code: 'COUPON_NOT_FOUND',
    user: 'bob',
    reqId: refused.headers['x-request-id'],
  });
  // A request id the rules refuse is replaced, in the answer and in the log line alike.
  const odd = await call(url, 'GET', '/coupons/424243', { headers: { 'x-request-id': '<script>alert(1)</script>' } });
  const oddLine = () => output.split('\n').find((l) => l.includes('"url":"/coupons/424243"'));
  for (let i = 0; !oddLine() && i < 100; i++) await sleep(50);
  expect(odd.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  expect(JSON.parse(oddLine() ?? '{}')).toMatchObject({ reqId: odd.headers['x-request-id'], status: 404 });
  expect(output).not.toContain('<script>');
  const coupon = await call(url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: 5 }) });
  expect(coupon.status).toBe(201);
  // The page answered from memory ahead of Fastify (public-reads.ts), the second time, logs the same line.
  const pageLines = () => output.split('\n').filter((l) => l.includes(`"url":"/coupons/${coupon.body.id}"`));
  for (const id of ['page-read-1', 'page-read-2'])
    expect((await call(url, 'GET', `/coupons/${coupon.body.id}`, { headers: { 'x-request-id': id } })).status).toBe(200);
  for (let i = 0; pageLines().length < 2 && i < 100; i++) await sleep(50);
  const expected = (reqId: string) => ({
    msg: 'request',
    method: 'GET',
    route: '/coupons/:couponId',
    status: 200,
    reqId,
    ms: expect.any(Number),
  });
  expect(pageLines().map((l) => JSON.parse(l) as unknown)).toEqual([
    expect.objectContaining(expected('page-read-1')),
    expect.objectContaining(expected('page-read-2')),
  ]);

  // Hold the coupon's stock row, so the grab below is in flight (waiting on it) when SIGTERM arrives.
  const db = await mysql.createConnection({
    host: config.DB_HOST,
    port: config.DB_PORT,
    user: config.DB_USER,
    password: config.DB_PASSWORD,
    database: config.DB_NAME,
  });
  blocker = db;
  await db.query('BEGIN');
  await db.query('SELECT * FROM coupon_stock WHERE coupon_id = ? FOR UPDATE', [coupon.body.id]);
  const grab = call(url, 'POST', `/coupons/${coupon.body.id}/grab`, { token: tokenFor('alice'), headers: { 'Idempotency-Key': 'k1' } });
  // In flight: a statement of the server on the stock row, waiting for the lock held here.
  for (let i = 0; ; i++) {
    const [rows] = await db.query<mysql.RowDataPacket[]>(
      `SELECT COUNT(*) AS n FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID() AND info LIKE '%coupon_stock%'`,
      [config.DB_NAME],
    );
    if (Number(rows[0].n) > 0) break;
    if (i > 400) throw new Error('the grab never reached the database');
    await sleep(25);
  }

  // A request whose headers are not complete yet at the signal (or a kept-alive connection's next
  // one): it arrives once the server is closing, held open by the grab in flight.
  const late = connect(port, '127.0.0.1');
  late.on('error', () => undefined);
  let lateAnswer = '';
  late.on('data', (d: Buffer) => (lateAnswer += d.toString()));
  const lateClosed = new Promise<void>((ok) => late.once('close', () => ok()));
  await new Promise<void>((ok) => late.write('GET /health HTTP/1.1\r\nHost: x\r\n', () => ok()));

  child.kill('SIGTERM');
  // Closing: the server no longer accepts connections (Nest's shutdown hooks run before that).
  for (let i = 0; await accepts(port); i++) {
    if (i > 200) throw new Error(`the server never started closing:\n${output}`);
    await sleep(25);
  }
  late.write('\r\n');
  await lateClosed;
  const [head, text] = lateAnswer.split('\r\n\r\n');
  const [statusLine, ...headerLines] = head.split('\r\n');
  const headers = Object.fromEntries(
    headerLines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
  );
  expect(statusLine).toBe('HTTP/1.1 503 Service Unavailable');
  expect(JSON.parse(text)).toEqual({ code: 'SERVICE_UNAVAILABLE', message: expect.any(String) });
  expect(headers).toMatchObject({ 'x-request-id': expect.stringMatching(/^[0-9a-f-]{36}$/), 'retry-after': '1', connection: 'close' });
  checkReply('GET', '/health', { status: 503, body: JSON.parse(text), headers, sentAt: Date.now(), ms: 0 }, text);
  // Its log line is the service's own, like every request's.
  const lateLine = () => output.split('\n').find((l) => l.includes(`"reqId":"${headers['x-request-id']}"`));
  for (let i = 0; !lateLine() && i < 100; i++) await sleep(50);
  expect(JSON.parse(lateLine() ?? '{}')).toMatchObject({
    msg: 'request',
    method: 'GET',
    route: '/health',
    status: 503,
    code: 'SERVICE_UNAVAILABLE',
  });
  expect(child.exitCode).toBeNull(); // still finishing the grab
  await db.query('COMMIT');
  const answer = await grab;
  // Answered while the server closes: its client must not send the next request on this connection.
  expect([answer.status, answer.headers.connection]).toEqual([201, 'close']);
  const stoppedAt = Date.now();
  expect(await exited).toEqual({ code: 0, signal: null });
  // Idle keep-alive connections (this test's agent keeps one) do not hold the stop up.
  expect(Date.now() - stoppedAt).toBeLessThan(10_000);

  expect(output).toMatch(
    /"msg":"SIGTERM received: finishing requests in flight, stopping jobs, closing the database pool \(at most 20000 ms; a second signal exits at once\)"/,
  );
  expect(output).toMatch(/"msg":"Stopped gracefully"/);
  expect(output).not.toMatch(/ERR!/);
  expect(output).not.toContain('refusing to accept new requests');
  const [left] = await db.query<mysql.RowDataPacket[]>(
    `SELECT COUNT(*) AS n FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()`,
    [config.DB_NAME],
  );
  await db.end();
  blocker = undefined;
  expect(Number(left[0].n)).toBe(0);
  const [stored] = await (async () => {
    const c = await mysql.createConnection({
      host: config.DB_HOST,
      port: config.DB_PORT,
      user: config.DB_USER,
      password: config.DB_PASSWORD,
      database: config.DB_NAME,
    });
    try {
      return await c.query<mysql.RowDataPacket[]>(`SELECT COUNT(*) AS n FROM user_coupon WHERE user_id = 'alice'`);
    } finally {
      await c.end();
    }
  })();
  expect(Number(stored[0].n)).toBe(1);
}, 180_000);

it('drains before it stops with SHUTDOWN_DRAIN_MS: /health 503 while requests are still served, each answer closing its connection, so a balancer that follows /health loses none', async () => {
  const server = await startServer({ dbName: config.DB_NAME, env: { SHUTDOWN_DRAIN_MS: '3000', LOG_LEVEL: 'info' } });
  const coupon = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: 5 }) });
  expect(coupon.status).toBe(201);
  // A balancer's view of the instance: routable while /health answers 200, polled every 100 ms.
  let routable = true;
  const poller = (async () => {
    while (routable) {
      if ((await call(server.url, 'GET', '/health', { timeoutMs: 1000 })).status !== 200) routable = false;
      else await sleep(100);
    }
  })();
  // Shoppers on kept-alive connections, through the balancer: the coupon page (answered ahead of
  // Fastify) and "my coupons" (through Nest and the database).
  const replies: Awaited<ReturnType<typeof call>>[] = [];
  const shopper = async (n: number) => {
    while (routable) {
      const path = n % 2 === 0 ? `/coupons/${coupon.body.id}` : '/me/coupons';
      replies.push(await call(server.url, 'GET', path, { token: tokenFor(`drain-${n}`) }));
    }
  };
  const shoppers = Array.from({ length: 60 }, (_, n) => shopper(n));
  await sleep(500);
  const signalledAt = Date.now();
  server.child.kill('SIGTERM');
  await poller;
  // Draining: still accepting and serving, but every answer closes its connection.
  const page = await call(server.url, 'GET', `/coupons/${coupon.body.id}`);
  const mine = await call(server.url, 'GET', '/me/coupons', { token: tokenFor('late') });
  const health = await call(server.url, 'GET', '/health');
  expect([page.status, page.headers.connection]).toEqual([200, 'close']);
  expect([mine.status, mine.headers.connection]).toEqual([200, 'close']);
  expect([health.status, health.body.code, health.headers['retry-after']]).toEqual([503, 'SERVICE_UNAVAILABLE', '1']);
  expect(health.body.details).toEqual({ checks: { stopping: { status: 'down' } } });
  // Long work is turned away to another instance: the close would cut it.
  const run = await call(server.url, 'POST', '/admin/reconciliation/runs', { token: adminToken() });
  const bulk = await call(server.url, 'POST', `/admin/coupons/${String(coupon.body.id)}/issuances`, {
    token: adminToken(),
    headers: { 'Idempotency-Key': 'drain-bulk' },
    body: { userIds: ['drain-bulk-user'], reason: 'drain', fromStock: false },
  });
  for (const refused of [run, bulk])
    expect([refused.status, refused.body.code, refused.headers['retry-after']]).toEqual([503, 'SERVICE_UNAVAILABLE', '1']);
  expect(Date.now() - signalledAt).toBeLessThan(3000);
  await Promise.all(shoppers);
  await new Promise<void>((ok) => (server.child.exitCode !== null ? ok() : server.child.once('exit', () => ok())));
  expect(server.child.exitCode).toBe(0);
  expect(Date.now() - signalledAt).toBeGreaterThanOrEqual(3000);
  // Not one shopper's request reset or refused: the balancer moved them away before the listener closed.
  expect(replies.length).toBeGreaterThan(100);
  expect(replies.filter((r) => r.status !== 200).map((r) => `${r.status} ${r.error ?? r.body.code}`)).toEqual([]);
  const log = readFileSync(server.logFile, 'utf8');
  expect(log).toContain('SIGTERM received: draining for 3000 ms (/health answers 503), then finishing requests in flight');
  expect(log).toContain('Stopped gracefully');
}, 60_000);
