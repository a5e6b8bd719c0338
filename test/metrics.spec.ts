// The flash-sale dashboard's numbers on /metrics, and /health naming the check that failed.
import { Writable } from 'node:stream';
import { jest } from '@jest/globals';
import { ArgumentsHost, Logger } from '@nestjs/common';
import mysql from 'mysql2/promise';
import pino from 'pino';
import request from 'supertest';
import { HttpExceptionFilter } from '../src/common/http-exception.filter.js';
import { HealthDatabase } from '../src/health/health-database.js';
import { ExpiryService } from '../src/state-machine/expiry.service.js';
import { createCoupon, newKey } from './support/factories.js';
import { bearer, startTestApp, TestApp, testConfig, tokenFor } from './support/harness.js';
import { freePort } from './support/net.js';

const POOL = 3;

/** The value of one series of the Prometheus text, or undefined when it is absent. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = (m[2] ?? '').split(',').filter(Boolean);
    if (want.every((w) => have.includes(w)) && have.length === want.length) return Number(m[3]);
  }
  return undefined;
}

describe('metrics', () => {
  let t: TestApp;
  beforeAll(async () => {
    // One transaction per grab, so blocked grabs hold one connection each.
    t = await startTestApp({ DB_POOL_SIZE: String(POOL), GRAB_STRATEGY: 'per-request' });
  });
  afterAll(() => t.close());

  const metrics = async () => (await request(t.url).get('/metrics')).text;
  const grab = (couponId: string, user: string) =>
    request(t.url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor(user)))
      .set('Idempotency-Key', newKey());

  it('remaining stock per coupon and grab outcomes per coupon', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 2 });
    const other = await createCoupon(t.url, { totalStock: 7 });
    expect((await grab(coupon.id, 'm-a')).status).toBe(201);
    expect((await grab(coupon.id, 'm-b')).status).toBe(201);
    expect((await grab(coupon.id, 'm-c')).body.code).toBe('SOLD_OUT');
    expect((await grab('987654321', 'm-c')).body.code).toBe('COUPON_NOT_FOUND');
    const text = await metrics();
    expect(sample(text, 'coupon_remaining_stock', { coupon_id: coupon.id })).toBe(0);
    expect(sample(text, 'coupon_remaining_stock', { coupon_id: other.id })).toBe(7);
    expect(sample(text, 'grab_outcomes_total', { coupon_id: coupon.id, result: 'ISSUED' })).toBe(2);
    expect(sample(text, 'grab_outcomes_total', { coupon_id: coupon.id, result: 'SOLD_OUT' })).toBe(1);
    // A made-up id is no series of its own.
    expect(text).not.toMatch(/coupon_id="987654321"/);
    expect(sample(text, 'grab_outcomes_total', { coupon_id: 'unknown', result: 'COUPON_NOT_FOUND' })).toBeGreaterThanOrEqual(1);

    // Stock changed outside the grab path shows at the next scrape.
    await request(t.url)
      .post(`/admin/coupons/${other.id}/stock`)
      .set(bearer(tokenFor('ops', ['admin'])))
      .send({ delta: 3 });
    expect(sample(await metrics(), 'coupon_remaining_stock', { coupon_id: other.id })).toBe(10);
  });

  it('the pool: in use, idle and waiting', async () => {
    const idle = await metrics();
    expect(sample(idle, 'db_pool_connections', { state: 'in_use' })).toBe(0);
    expect(sample(idle, 'db_pool_connections', { state: 'idle' })).toBe(POOL);
    expect(sample(idle, 'db_pool_waiting_requests')).toBe(0);

    const coupon = await createCoupon(t.url, { totalStock: 100, perUserLimit: 10 });
    expect(sample(await metrics(), 'coupon_remaining_stock', { coupon_id: coupon.id })).toBe(100);
    const c = t.config;
    const blocker = await mysql.createConnection({
      host: c.DB_HOST,
      port: c.DB_PORT,
      user: c.DB_USER,
      password: c.DB_PASSWORD,
      database: c.DB_NAME,
    });
    try {
      await blocker.query('BEGIN');
      await blocker.query('SELECT * FROM coupon_stock WHERE coupon_id = ? FOR UPDATE', [coupon.id]);
      // then(): supertest sends a request only once it is awaited.
      const grabs = Array.from({ length: POOL + 2 }, (_, i) => grab(coupon.id, `m-pool-${i}`).then((r) => r));
      let text = '';
      for (let i = 0; i < 200; i++) {
        text = await metrics();
        if (sample(text, 'db_pool_waiting_requests') === 2) break;
        await new Promise((r) => setTimeout(r, 25));
      }
      expect(sample(text, 'db_pool_connections', { state: 'in_use' })).toBe(POOL);
      expect(sample(text, 'db_pool_connections', { state: 'idle' })).toBe(0);
      expect(sample(text, 'db_pool_waiting_requests')).toBe(2);
      // The scrape took no connection and queued for none: the stock it shows is the last one read.
      expect(sample(text, 'coupon_remaining_stock', { coupon_id: coupon.id })).toBe(100);
      await blocker.query('COMMIT');
      expect((await Promise.all(grabs)).map((r) => r.status)).toEqual(Array(POOL + 2).fill(201));
    } finally {
      await blocker.end();
    }
  });

  it('transaction retries, sweeps and reconciliation are counted', async () => {
    const text = await metrics();
    for (const name of [
      'db_transaction_retries_total',
      'expiry_sweep_runs_total',
      'expiry_sweep_rows_total',
      'reconciliation_runs_total',
    ]) {
      expect([name, text.includes(`# TYPE ${name} counter`)]).toEqual([name, true]);
    }
  });

  it('a sweep logs its outcome at info, also when there was nothing to expire', async () => {
    const log = jest.spyOn(Logger.prototype, 'log');
    try {
      await t.app.get(ExpiryService).runExclusive();
      expect(log.mock.calls.map((c) => String(c[0]))).toContainEqual(
        expect.stringMatching(/^Expiry sweep complete: 0 coupons expired in 1 batches/),
      );
    } finally {
      log.mockRestore();
    }
  });

  it('/health names the check that failed', async () => {
    expect((await request(t.url).get('/health')).status).toBe(200);
    // The health check's connection gone (it has its own: test/health.spec.ts): the database check fails, and /metrics still answers.
    await t.app.get(HealthDatabase).dataSource.destroy();
    const res = await request(t.url).get('/health');
    expect([res.status, res.body.code]).toEqual([503, 'SERVICE_UNAVAILABLE']);
    expect(res.body.message).toMatch(/database/);
    expect(res.body.details.checks.database.status).toBe('down');
    expect((await request(t.url).get('/metrics')).status).toBe(200);
  });
});

it('a 503 is logged with the request id of the request it answers', () => {
  const lines: string[] = [];
  const sink = new Writable({ write: (chunk: Buffer, _enc, done) => (lines.push(chunk.toString()), done()) });
  const log = pino(sink).child({ reqId: 'req-1234' });
  const reply = { headers: () => reply, header: () => reply, type: () => reply, status: () => reply, send: () => reply };
  const req = { log, headers: {} };
  const host = { switchToHttp: () => ({ getRequest: () => req, getResponse: () => reply }) } as unknown as ArgumentsHost;
  new HttpExceptionFilter().catch(
    Object.assign(new Error('Connection lost: The server closed the connection.'), { code: 'PROTOCOL_CONNECTION_LOST' }),
    host,
  );
  const warned = lines.map((l) => JSON.parse(l) as { level: number; reqId: string; msg: string }).filter((l) => l.level === 40);
  expect(warned).toEqual([
    expect.objectContaining({ reqId: 'req-1234', msg: expect.stringMatching(/^Answering 503 for a database error/) }),
  ]);
  expect((req as { errorCode?: string }).errorCode).toBe('SERVICE_UNAVAILABLE');
});

it('behind DB_HOSTS the pool gauges sum the pools of the hosts', async () => {
  const real = testConfig();
  const t = await startTestApp({ DB_HOSTS: `127.0.0.1:${await freePort()},${real.DB_HOST}:${real.DB_PORT}`, DB_POOL_SIZE: '2' });
  try {
    const text = (await request(t.url).get('/metrics')).text;
    expect(sample(text, 'db_pool_connections', { state: 'idle' })).toBe(2);
    expect(sample(text, 'db_pool_connections', { state: 'in_use' })).toBe(0);
  } finally {
    await t.close();
  }
});
