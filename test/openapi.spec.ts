import { readFileSync } from 'node:fs';
import { CLIENT_TYPES, OPENAPI_JSON, renderClientTypes, renderDocument } from '../scripts/openapi-render.js';
import { ERROR_STATUS } from '../src/common/errors.js';
import { ROUTES } from '../src/openapi/routes.js';
import { ContractChecker, documentAjv } from './support/contract.js';

interface Operation {
  security?: unknown[];
  'x-roles'?: string[];
  summary?: string;
  requestBody?: { content: Record<string, { schema: object; example?: unknown }> };
  responses: Record<string, { content?: Record<string, { schema: { allOf?: { properties?: { code?: { enum: string[] } } }[] } }> }>;
}
type Doc = { paths: Record<string, Record<string, Operation>>; servers: unknown[] };

describe('the OpenAPI document', () => {
  let generated: string;
  let doc: Doc;
  const operations = () =>
    Object.entries(doc.paths).flatMap(([path, item]) => Object.entries(item).map(([m, op]) => ({ key: `${m.toUpperCase()} ${path}`, op })));

  beforeAll(async () => {
    generated = await renderDocument();
    doc = JSON.parse(generated) as Doc;
  });

  it('committed docs/openapi.json and client/schema.d.ts are what the code generates (else run npm run openapi)', async () => {
    expect(readFileSync(OPENAPI_JSON, 'utf8')).toBe(generated);
    expect(readFileSync(CLIENT_TYPES, 'utf8')).toBe(await renderClientTypes(generated));
  });

  it('declares every served route in src/openapi/routes.ts, and nothing else', () => {
    expect(
      operations()
        .map((o) => o.key)
        .sort(),
    ).toEqual(Object.keys(ROUTES).sort());
  });

  it('names security and roles on every operation, and a summary', () => {
    for (const { key, op } of operations()) {
      const route = ROUTES[key];
      expect([key, op.security]).toEqual([key, route.auth === 'public' ? [] : [{ bearer: [] }]]);
      expect([key, op['x-roles']]).toEqual([key, Array.isArray(route.auth) ? route.auth : undefined]);
      expect(op.summary).toBe(route.summary);
    }
    expect(doc.servers).toHaveLength(1);
  });

  it('gives every path parameter the pattern the route checks it against', () => {
    for (const { key, op } of operations()) {
      const params = (op as { parameters?: { in: string; name: string; schema?: { pattern?: string } }[] }).parameters ?? [];
      for (const p of params.filter((x) => x.in === 'path'))
        expect([key, p.name, typeof p.schema?.pattern]).toEqual([key, p.name, 'string']);
    }
  });

  it('documents each error code under the status it is answered with', () => {
    for (const { key, op } of operations()) {
      for (const [status, response] of Object.entries(op.responses)) {
        if (Number(status) < 400) continue;
        const codes = response.content?.['application/json'].schema.allOf?.[1].properties?.code?.enum ?? [];
        expect([key, status, codes.length > 0]).toEqual([key, status, true]);
        for (const code of codes) expect([key, code, ERROR_STATUS[code as keyof typeof ERROR_STATUS]]).toEqual([key, code, Number(status)]);
      }
    }
  });

  it("every request example (the body Swagger UI offers) is valid against the operation's own schema", () => {
    const ajv = documentAjv(doc, 'doc');
    let checked = 0;
    for (const { key, op } of operations()) {
      const json = op.requestBody?.content['application/json'];
      if (!json) continue;
      expect([key, json.example !== undefined]).toEqual([key, true]);
      const validate = ajv.compile({
        $ref: `doc#/paths/${encodeURIComponent(key.split(' ')[1].replaceAll('/', '~1'))}/${key.split(' ')[0].toLowerCase()}/requestBody/content/application~1json/schema`,
      });
      expect([key, validate(json.example), validate.errors ?? null]).toEqual([key, true, null]);
      checked++;
    }
    expect(checked).toBeGreaterThan(5);
  });

  it('refuses in its request schemas the bodies the service refuses for their shape alone', () => {
    const ajv = documentAjv(doc, 'doc');
    const valid = (key: string, body: unknown) =>
      ajv.compile({
        $ref: `doc#/paths/${encodeURIComponent(key.split(' ')[1].replaceAll('/', '~1'))}/${key.split(' ')[0].toLowerCase()}/requestBody/content/application~1json/schema`,
      })(body);
    const url = 'https://hooks.example.com/coupons';
    for (const [key, body] of [
      ['POST /admin/webhooks', { url, events: [] }],
      ['POST /admin/webhooks', { url, events: ['user_coupon.used', 'user_coupon.used'] }],
      ['POST /admin/webhooks', { url: 'ftp://hooks.example.com/' }],
      ['PATCH /admin/webhooks/{webhookId}', {}],
      ['PATCH /admin/coupons/{couponId}', {}],
      ['POST /admin/coupons/{couponId}/stock', { delta: 0 }],
    ] as const)
      expect([key, body, valid(key, body)]).toEqual([key, body, false]);
    expect(valid('POST /admin/coupons/{couponId}/stock', { delta: -1 })).toBe(true);
    expect(valid('PATCH /admin/webhooks/{webhookId}', { events: ['user_coupon.used'] })).toBe(true);
  });
});

describe('the answer checker', () => {
  const checker = new ContractChecker();
  const answer = {
    method: 'GET',
    route: '/coupons/:couponId',
    headers: { 'x-request-id': 'r-1', 'content-type': 'application/json; charset=utf-8', vary: 'Accept-Encoding' },
  };
  const coupon = {
    id: '1',
    name: 'n',
    status: 'ACTIVE',
    perUserLimit: 1,
    grabStartAt: '2026-01-01T00:00:00.000Z',
    grabEndAt: '2026-01-02T00:00:00.000Z',
    validity: { type: 'RELATIVE', days: 7 },
    discount: { type: 'AMOUNT', thresholdCents: 0, amountCents: 100 },
    rateLimitPerSecond: null,
    returnOnRefund: false,
    stackable: false,
    initStock: 10,
    remainingStock: 10,
  };

  it('passes a conforming answer', () => {
    expect(checker.check({ ...answer, status: 200, body: JSON.stringify(coupon) })).toEqual([]);
    expect(checker.check({ ...answer, status: 404, body: JSON.stringify({ code: 'COUPON_NOT_FOUND', message: 'no' }) })).toEqual([]);
  });

  it('names an undocumented status, a body off its schema, a code the route cannot give and a missing header', () => {
    expect(checker.check({ ...answer, status: 500, body: '{}' })).toEqual([expect.stringContaining('status 500 is not documented')]);
    expect(checker.check({ ...answer, status: 200, body: JSON.stringify({ ...coupon, initStock: 1.5 }) })).toEqual([
      expect.stringContaining('body/initStock must be integer'),
    ]);
    expect(checker.check({ ...answer, status: 404, body: JSON.stringify({ code: 'GRAB_NOT_FOUND', message: 'no' }) })).toEqual([
      expect.stringContaining('body/code must be equal to one of the allowed values'),
    ]);
    expect(
      checker.check({ ...answer, headers: { 'content-type': 'application/json' }, status: 200, body: JSON.stringify(coupon) }),
    ).toEqual(['required header x-request-id is missing', 'required header Vary is missing']);
    expect(
      checker.check({
        ...answer,
        method: 'POST',
        route: '/redemptions',
        status: 200,
        body: '{}',
      }),
    ).toEqual(expect.arrayContaining(['required header Idempotent-Replayed is missing']));
  });

  it('holds unrouted answers to the error body with a code of their status', () => {
    const unrouted = { ...answer, route: undefined };
    expect(checker.check({ ...unrouted, status: 404, body: JSON.stringify({ code: 'NOT_FOUND', message: 'Route not found' }) })).toEqual(
      [],
    );
    expect(checker.check({ ...unrouted, status: 404, body: JSON.stringify({ code: 'SOLD_OUT', message: 'x' }) })).toEqual([
      'status 404 does not go with code SOLD_OUT',
    ]);
  });
});
