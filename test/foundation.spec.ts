import request from 'supertest';
import { startTestApp, TestApp } from './support/harness.js';

describe('foundation', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  it('answers /health with the database up', async () => {
    const res = await request(t.url).get('/health');
    expect(res.status).toBe(200);
    expect(res.body.info.database.status).toBe('up');
  });

  it('gives unknown routes 404 NOT_FOUND in the error format', async () => {
    const res = await request(t.url).get('/no/such/route');
    expect(res.status).toBe(404);
    expect(res.body).toEqual({ code: 'NOT_FOUND', message: expect.any(String) });
  });

  it('gives unknown routes 404 whatever the type of their body, a CSV (which one route takes) included', async () => {
    // A mistyped upload route: the trailing slash, the singular.
    for (const path of ['/no/such/route', '/admin/coupons/1/issuances/', '/admin/coupons/1/issuance'])
      for (const type of ['text/csv', 'application/json', 'text/plain', 'application/xml']) {
        const res = await request(t.url)
          .post(path)
          .set('Content-Type', type)
          .send(type === 'application/json' ? '{}' : 'a\n');
        expect([path, type, res.status, res.body.code]).toEqual([path, type, 404, 'NOT_FOUND']);
      }
  });

  it('serves Prometheus metrics with the HTTP duration histogram labelled by route and status', async () => {
    await request(t.url).get('/health');
    const res = await request(t.url).get('/metrics');
    expect(res.status).toBe(200);
    expect(res.text).toMatch(/http_request_duration_seconds_bucket\{[^}]*route="\/health",status="200"/);
    expect(res.text).toContain('process_cpu_user_seconds_total');
  });

  it('serves the OpenAPI document', async () => {
    const res = await request(t.url).get('/docs-json');
    expect(res.status).toBe(200);
    expect(res.body.openapi).toMatch(/^3\./);
    // Only the routes the documentation names: no YAML copy beside it.
    expect((await request(t.url).get('/docs-yaml')).body).toMatchObject({ code: 'NOT_FOUND' });
  });

  it('puts a request id on every answer', async () => {
    const res = await request(t.url).get('/health');
    expect(res.headers['x-request-id']).toMatch(/[0-9a-f-]{36}/);
  });
});
