import { Agent, IncomingHttpHeaders, request as httpRequest } from 'node:http';
import fc from 'fast-check';
import request from 'supertest';
import { ERROR_STATUS } from '../src/common/errors.js';
import { couponBody, createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { databaseFingerprint } from './support/fingerprint.js';

/**
 * Generated input on every route (from the OpenAPI document): bodies, headers, paths, query strings,
 * content types, malformed and oversized JSON. Whatever comes in: no 5xx, every error in the one
 * error format with the status its code maps to, and a rejected request leaves every table as it was.
 */

type Method = 'get' | 'post' | 'patch';
interface Route {
  method: Method;
  path: string;
  /** The query parameters the document declares. */
  query: string[];
}
interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
}
interface Sent {
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: string | Buffer;
}

const USER = 'fuzzer';
const KIB = 1024;
const label = (r: Route) => `${r.method} ${r.path}`;

/** A long generated string that fast-check reports by a short label instead of printing it whole. */
class Long {
  constructor(
    readonly text: string,
    private readonly name: string,
  ) {}
  [fc.toStringMethod](): string {
    return this.name;
  }
}
const long = (name: string, text: string) => new Long(text, name);
const textOf = (v: string | Long) => (typeof v === 'string' ? v : v.text);
const agent = new Agent({ keepAlive: true, maxSockets: 4 });

/** node:http rather than supertest: raw paths, raw bodies, any header. Null when Node itself refuses to send it. */
function send(base: URL, req: Sent): Promise<Answer | null> {
  return new Promise((resolve, reject) => {
    // An explicit length, or Node sends DELETE and OPTIONS bodies unframed and the next request on the socket is garbage.
    const headers =
      req.body !== undefined && !req.headers['transfer-encoding']
        ? { ...req.headers, 'content-length': String(Buffer.byteLength(req.body)) }
        : req.headers;
    let r;
    try {
      r = httpRequest({ host: base.hostname, port: base.port, agent, method: req.method, path: req.path, headers }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      });
    } catch {
      resolve(null);
      return;
    }
    r.on('error', reject);
    r.end(req.body);
  });
}

/**
 * Text whose UTF-16 length, grapheme count and code-point count all differ: combining marks,
 * variation selectors, emoji ZWJ sequences with skin tones and flags, astral-plane letters.
 */
const WIDE_PIECES = [
  'a\uFE0F',
  'e\u0301',
  'o\u0308\u0332',
  '\u{1F44D}\u{1F3FD}',
  '\u{1F468}\u200D\u{1F469}\u200D\u{1F467}\u200D\u{1F466}',
  '\u{1F3F3}\uFE0F\u200D\u{1F308}',
  '\u{1F1EF}\u{1F1F5}',
  '\u{1D518}',
  '\u{20000}',
  '\u{10FFFF}',
  '\u200D',
  '\u0915\u094D\u0937',
  '字',
  'a',
];
/** Column sizes of the text fields (VARCHAR n): generated texts land on either side of each. */
const TEXT_LIMITS = [64, 128, 200, 255, 500];
const codePoints = (s: string) => [...s].length;
/** Text of about `limit` code points (one piece short, exactly, or just over) built from WIDE_PIECES. */
const wideText = (limit: number) =>
  fc
    .tuple(fc.array(fc.constantFrom(...WIDE_PIECES), { minLength: 1, maxLength: 8 }), fc.integer({ min: -1, max: 1 }))
    .map(([pieces, offset]) => {
      let text = '';
      for (let i = 0; codePoints(text) < limit + offset; i++) text += pieces[i % pieces.length];
      return text;
    });

/** Values that break naive code: huge and fractional numbers, wrong types, SQL, unicode, dates out of range. */
const nastyScalar = fc.oneof(
  fc.constantFrom<unknown>(
    1e308,
    -1e308,
    Number.MAX_SAFE_INTEGER + 2,
    -Number.MAX_SAFE_INTEGER,
    2 ** 63,
    2 ** 64,
    -1,
    0,
    1.5,
    -0.0001,
    '1',
    '',
    ' ',
    '0',
    '-1',
    'null',
    'true',
    '0x10',
    '1e3',
    'NaN',
    'Infinity',
    "' OR 1=1 --",
    "'; DROP TABLE coupon; --",
    '1; SELECT SLEEP(10)',
    "\\'",
    '%',
    '_',
    '\u0000',
    '\u202eevil',
    '\ud800',
    '🙂🙂🙂',
    'Ω'.repeat(300),
    '9223372036854775808',
    '18446744073709551616',
    '-9223372036854775809',
    '0000-00-00T00:00:00Z',
    '1969-12-31T23:59:59Z',
    '9999-12-31T23:59:59.999Z',
    '2024-02-30T00:00:00Z',
    '2024-01-01',
    '2024-01-01T00:00:00+14:00',
    '+275760-09-13T00:00:00Z',
    null,
    true,
    false,
    [],
    {},
    [1, 2],
    { $gt: '' },
    { toString: 'x' },
    'ACTIVE',
    'PAUSED',
    'FIXED',
    'RELATIVE',
    'USED',
    'admin',
  ),
  fc.integer(),
  fc.double(),
  fc.bigInt({ min: -(2n ** 80n), max: 2n ** 80n }).map(String),
  fc.string({ unit: 'grapheme', maxLength: 80 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.string({ minLength: 60, maxLength: 300 }),
  fc.string({ unit: 'grapheme-composite', maxLength: 80 }),
  fc.string({ unit: 'binary', minLength: 60, maxLength: 300 }),
  fc.constantFrom(...TEXT_LIMITS).chain((limit) => wideText(limit)),
);
const nasty = fc.oneof({ weight: 4, arbitrary: nastyScalar }, { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 3 }) });
/** Numbers JSON can carry but a JavaScript number cannot represent exactly, sent as raw text. */
const RAW_NUMBERS = [
  '1e400',
  '-1e400',
  '123456789012345678901234567890',
  '9007199254740993',
  '1.0',
  '-0',
  '1E2',
  '0.1e1',
  '1e-400',
  '100000000000000000000000.5',
];
const RAW = 'RAW-NUMBER-PLACEHOLDER';
const POLLUTION_KEYS = ['__proto__', 'constructor', 'prototype', '__defineGetter__', 'toString', 'hasOwnProperty', 'valueOf'];

function leafPaths(value: unknown, prefix = ''): string[] {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return [];
  return Object.entries(value).flatMap(([k, v]) => [prefix + k, ...leafPaths(v, `${prefix}${k}.`)]);
}

function setPath(target: Record<string, unknown>, path: string, value: unknown, remove: boolean): void {
  const keys = path.split('.');
  let node: Record<string, unknown> = target;
  for (const k of keys.slice(0, -1)) {
    if (typeof node[k] !== 'object' || node[k] === null) return;
    node = node[k] as Record<string, unknown>;
  }
  const last = keys[keys.length - 1];
  if (remove) delete node[last];
  else node[last] = value;
}

/** JSON text with `key` as the first member of the object, whatever key it is (JSON.stringify cannot emit an own __proto__). */
const withFirstMember = (json: string, key: string, value: unknown) =>
  `{${JSON.stringify(key)}:${JSON.stringify(value)}${json === '{}' ? '}' : `,${json.slice(1)}`}`;

describe('fuzz', () => {
  let t: TestApp;
  let base: URL;
  let routes: Route[];
  let ids: Record<string, string>;
  let examples: Record<string, Record<string, unknown>>;
  let fingerprint: Record<string, string>;
  let tables: string[];
  const stats = { requests: 0, refusedByClient: 0, byClass: {} as Record<string, number> };

  beforeAll(async () => {
    t = await startTestApp();
    base = new URL(t.url);
    const doc = (await request(t.url).get('/docs-json')).body as {
      paths: Record<string, Record<string, { parameters?: { in: string; name: string }[] }>>;
    };
    routes = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.entries(ops).map(([method, op]) => ({
        method: method as Method,
        path,
        query: (op.parameters ?? []).filter((p) => p.in === 'query').map((p) => p.name),
      })),
    );
    const coupon = await createCoupon(t.url, { totalStock: 1_000_000, perUserLimit: 1_000_000, returnOnRefund: true });
    const key = newKey('fuzz');
    const grabbed = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor(USER)))
      .set('Idempotency-Key', key);
    expect(grabbed.status).toBe(201);
    ids = { couponId: coupon.id, userCouponId: grabbed.body.id, idempotencyKey: key, runId: '1', id: '1' };
    examples = {
      'post /admin/coupons': { ...couponBody() },
      'patch /admin/coupons/{couponId}': { status: 'ACTIVE', rateLimitPerSecond: 1000 },
      'post /admin/coupons/{couponId}/stock': { delta: 1 },
      'post /admin/user-coupons/{userCouponId}/void': { reason: 'fuzz' },
      'post /admin/user-coupons/reissue': { couponId: coupon.id, userId: USER, reason: 'fuzz', fromStock: false },
      'post /admin/reconciliation/runs': { mode: 'FULL' },
      'post /admin/compensations/{id}/approve': { reason: 'fuzz' },
      'post /admin/compensations/{id}/reject': { reason: 'fuzz' },
      'post /redemptions': { userCouponId: grabbed.body.id, orderNo: 'F-1', orderAmountCents: 1_000_000 },
      'post /redemptions/refunds': { userCouponId: grabbed.body.id, orderNo: 'F-1', refundNo: 'RF-1' },
    };
    tables = Object.keys(await databaseFingerprint(t.db));
    fingerprint = await databaseFingerprint(t.db, tables);
  });
  afterAll(async () => {
    console.log(
      `fuzz: ${stats.requests} requests sent (${JSON.stringify(stats.byClass)}), ${stats.refusedByClient} refused by Node's client before sending`,
    );
    agent.destroy();
    await t.close();
  });

  const tokenOf = (r: Route) =>
    r.path.startsWith('/admin/') ? adminToken() : r.path === '/redemptions/refunds' ? serviceToken() : tokenFor(USER);
  const urlOf = (r: Route, params: Record<string, string> = {}) =>
    r.path.replace(/\{(\w+)\}/g, (_, name: string) => params[name] ?? ids[name] ?? '1');
  const bodyRoutes = () => routes.filter((r) => r.method !== 'get');
  // A bulk issuance list may be 64 MiB (test/bulk-issuance.spec.ts checks that limit); every other
  // body 64 KiB, a GET's included, though no GET takes one.
  const limitedRoutes = () => routes.filter((r) => !(r.method === 'post' && r.path === '/admin/coupons/{couponId}/issuances'));
  const exampleOf = (r: Route) => examples[label(r)] ?? {};

  /** Reconciliation runs in the background after its 202: wait for it, so its writes are not blamed on the next request. */
  async function settle(a: Answer): Promise<void> {
    if (a.status !== 202) return;
    const runId = (JSON.parse(a.text) as { runId?: string }).runId;
    for (let i = 0; i < 200; i++) {
      const run = await request(t.url).get(`/admin/reconciliation/runs/${runId}`).set(bearer(adminToken()));
      // The run's lease is released just after its status is written: wait for that write too.
      const [lease] = (await t.db.query(`SELECT holder FROM job_lease WHERE holder IS NOT NULL LIMIT 1`)) as unknown[];
      if (run.body.status !== 'RUNNING' && !lease) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`reconciliation run ${runId} did not finish`);
  }

  /** Sends one request and checks everything that must hold whatever was sent. */
  async function probe(req: Sent): Promise<Answer | null> {
    const a = await send(base, req);
    if (!a) {
      stats.refusedByClient++;
      return null;
    }
    stats.requests++;
    const cls = `${Math.floor(a.status / 100)}xx`;
    stats.byClass[cls] = (stats.byClass[cls] ?? 0) + 1;
    const cut = (s: string) => (s.length > 200 ? `${s.slice(0, 200)}...(${s.length} chars)` : s);
    const where = `${req.method} ${cut(req.path)} ${cut(JSON.stringify(req.headers))} ${cut(String(req.body ?? ''))} -> ${a.status} ${cut(a.text)}`;
    if (a.status >= 500 || a.status < 200) throw new Error(`server error: ${where}`);
    if (a.status >= 400) {
      if (req.method !== 'HEAD') {
        let body: Record<string, unknown>;
        try {
          body = JSON.parse(a.text) as Record<string, unknown>;
        } catch {
          throw new Error(`error body is not JSON: ${where}`);
        }
        const shapeOk =
          typeof body === 'object' &&
          body !== null &&
          Object.keys(body).every((k) => ['code', 'message', 'details'].includes(k)) &&
          typeof body.code === 'string' &&
          typeof body.message === 'string' &&
          body.message.length > 0 &&
          (body.details === undefined || (typeof body.details === 'object' && body.details !== null && !Array.isArray(body.details)));
        if (!shapeOk) throw new Error(`error body not {code, message, details?}: ${where}`);
        if (ERROR_STATUS[body.code as keyof typeof ERROR_STATUS] !== a.status) throw new Error(`code does not match status: ${where}`);
      }
      const after = await databaseFingerprint(t.db, tables);
      const changed = Object.keys(after).filter((k) => after[k] !== fingerprint[k]);
      if (changed.length > 0) throw new Error(`rejected request changed ${changed.join(', ')}: ${where}`);
    } else {
      await settle(a);
      fingerprint = await databaseFingerprint(t.db, tables);
    }
    return a;
  }

  const json = (r: Route, body: string | undefined, extra: Record<string, string> = {}): Sent => ({
    method: r.method.toUpperCase(),
    path: urlOf(r),
    headers: { authorization: `Bearer ${tokenOf(r)}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...extra },
    body,
  });

  it('the document lists the routes the fuzzer relies on', () => {
    expect(routes.length).toBeGreaterThanOrEqual(20);
    expect(bodyRoutes().map(label)).toEqual(expect.arrayContaining(Object.keys(examples)));
  });

  it('bodies: valid ones with fields replaced by huge numbers, wrong types, SQL, unicode, nested junk, or dropped', async () => {
    const mutation = fc.array(
      fc.tuple(fc.nat(), fc.oneof({ weight: 5, arbitrary: nasty.map((v) => ({ v })) }, { weight: 1, arbitrary: fc.constant(null) })),
      { minLength: 1, maxLength: 3 },
    );
    const extraField = fc.option(
      fc.tuple(
        fc.oneof(fc.constantFrom('admin', 'userId', 'status', 'stock', 'id', 'initStock', 'remainingStock'), fc.string({ maxLength: 20 })),
        nasty,
      ),
      { freq: 4 },
    );
    await fc.assert(
      fc.asyncProperty(fc.nat(), mutation, extraField, async (pick, changes, extra) => {
        const r = bodyRoutes()[pick % bodyRoutes().length];
        const body = structuredClone(exampleOf(r));
        const paths = leafPaths(body);
        for (const [i, change] of changes) if (paths.length > 0) setPath(body, paths[i % paths.length], change?.v, change === null);
        if (extra) body[extra[0]] = extra[1];
        await probe(json(r, JSON.stringify(body)));
      }),
      { numRuns: 700 },
    );
  });

  it('bodies: text fields at, just under and just over every column size, in combining, emoji and astral-plane text', async () => {
    const stringFields = (r: Route) =>
      leafPaths(exampleOf(r)).filter(
        (p) => typeof p.split('.').reduce<unknown>((o, k) => (o as Record<string, unknown>)[k], exampleOf(r)) === 'string',
      );
    const textRoutes = bodyRoutes().filter((r) => stringFields(r).length > 0);
    await fc.assert(
      fc.asyncProperty(fc.nat(), fc.nat(), fc.constantFrom(...TEXT_LIMITS).chain(wideText), async (pick, field, text) => {
        const r = textRoutes[pick % textRoutes.length];
        const body = structuredClone(exampleOf(r));
        const fields = stringFields(r);
        setPath(body, fields[field % fields.length], text, false);
        await probe(json(r, JSON.stringify(body)));
      }),
      { numRuns: 250 },
    );
  });

  it('bodies: any JSON value at all', async () => {
    await fc.assert(
      fc.asyncProperty(fc.nat(), fc.jsonValue({ maxDepth: 5 }), async (pick, value) => {
        const r = bodyRoutes()[pick % bodyRoutes().length];
        await probe(json(r, JSON.stringify(value)));
      }),
      { numRuns: 300 },
    );
  });

  it('bodies: numbers beyond double precision and range, as raw JSON text', async () => {
    await fc.assert(
      fc.asyncProperty(fc.nat(), fc.nat(), fc.constantFrom(...RAW_NUMBERS), async (pick, field, number) => {
        const r = bodyRoutes()[pick % bodyRoutes().length];
        const body = structuredClone(exampleOf(r));
        const paths = leafPaths(body);
        if (paths.length === 0) return;
        setPath(body, paths[field % paths.length], RAW, false);
        await probe(json(r, JSON.stringify(body).replace(`"${RAW}"`, number)));
      }),
      { numRuns: 150 },
    );
  });

  it('bodies: prototype-pollution keys at the top and nested, and the process prototype stays clean', async () => {
    await fc.assert(
      fc.asyncProperty(fc.nat(), fc.constantFrom(...POLLUTION_KEYS), nasty, fc.boolean(), async (pick, key, value, nested) => {
        const r = bodyRoutes()[pick % bodyRoutes().length];
        const example = exampleOf(r);
        const payload = { admin: true, roles: ['admin'], polluted: value, prototype: { polluted: true } };
        let text = withFirstMember(JSON.stringify(example), key, payload);
        const inner = Object.keys(example).find((k) => typeof example[k] === 'object' && example[k] !== null);
        if (nested && inner) {
          const { [inner]: child, ...rest } = example;
          text = withFirstMember(JSON.stringify(rest), inner, '__CHILD__').replace(
            '"__CHILD__"',
            withFirstMember(JSON.stringify(child), key, payload),
          );
        }
        const a = await probe(json(r, text));
        if (a && a.status < 400 && key === '__proto__') throw new Error(`__proto__ accepted by ${label(r)}: ${text}`);
      }),
      { numRuns: 200 },
    );
    const probeObject = {} as Record<string, unknown>;
    expect([probeObject.admin, probeObject.roles, probeObject.polluted]).toEqual([undefined, undefined, undefined]);
    expect(Object.keys(Object.prototype)).toEqual([]);
  });

  it('malformed JSON, deep nesting and non-object bodies answer 4xx', async () => {
    const deep = (n: number) => `{"name":${'['.repeat(n)}${']'.repeat(n)}}`;
    const malformed = fc.oneof(
      fc.constantFrom(
        '{',
        '}',
        '{"a":',
        '{"a":1,}',
        "{'a':1}",
        '{"a":NaN}',
        '{"a":Infinity}',
        '{"a":undefined}',
        '\uFEFF{}',
        '{}garbage',
        '{}{}',
        '{"a":"\\x41"}',
        '{"a":"\\ud800"}',
        'null',
        'true',
        '"str"',
        '[]',
        '[{}]',
        '1',
        ' ',
        '\u0000',
        '{"name":"a","name":"b"}',
      ),
      fc.constantFrom(
        long('arrays nested 1,000 deep', deep(1000)),
        long('arrays nested 30,000 deep', deep(30_000)),
        long('objects nested 2,000 deep', `[${'{"a":'.repeat(2000)}1${'}'.repeat(2000)}]`),
      ),
      fc.jsonValue({ maxDepth: 4 }).chain((v) => {
        const s = JSON.stringify(v) ?? 'null';
        return fc.nat({ max: Math.max(0, s.length - 1) }).map((cut) => s.slice(0, cut));
      }),
      fc.string({ unit: 'binary', maxLength: 200 }),
    );
    await fc.assert(
      fc.asyncProperty(fc.nat(), malformed, async (pick, generated) => {
        const r = bodyRoutes()[pick % bodyRoutes().length];
        const text = textOf(generated);
        const a = await probe(json(r, text));
        if (a && a.status < 400 && r.path !== '/coupons/{couponId}/grab' && r.path !== '/admin/reconciliation/runs')
          throw new Error(`accepted malformed body on ${label(r)}: ${text.slice(0, 200)}`);
      }),
      { numRuns: 250 },
    );
  });

  it('bodies over 64 KiB answer 413 PAYLOAD_TOO_LARGE on every route, with or without a token, with or without a length', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.nat(),
        fc.integer({ min: 64 * KIB + 1, max: 400 * KIB }),
        fc.boolean(),
        fc.boolean(),
        async (pick, size, authorized, chunked) => {
          const r = limitedRoutes()[pick % limitedRoutes().length];
          const text = JSON.stringify({ ...exampleOf(r), pad: 'x'.repeat(size) });
          const req = json(r, text);
          if (!authorized) delete req.headers.authorization;
          if (chunked) req.headers['transfer-encoding'] = 'chunked';
          const a = await probe(req);
          expect([a?.status, a && (JSON.parse(a.text) as { code: string }).code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
        },
      ),
      { numRuns: 30 },
    );
  });

  it('wrong and odd content types answer 4xx or are read as JSON, never 5xx', async () => {
    const types = fc.constantFrom(
      'text/plain',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=xyz',
      'application/xml',
      'application/octet-stream',
      'image/png',
      '*/*',
      '',
      'application/json; charset=latin1',
      'application/json; charset=utf-16',
      'application/json; charset=nonsense',
      'APPLICATION/JSON',
      'application/json-patch+json',
      'application/vnd.api+json',
      'application/json, text/plain',
      'application/jsonx',
    );
    await fc.assert(
      fc.asyncProperty(
        fc.nat(),
        types,
        fc.oneof(fc.constant('valid'), fc.constant('form'), fc.string({ maxLength: 100 })),
        async (pick, contentType, kind) => {
          const r = bodyRoutes()[pick % bodyRoutes().length];
          const body = kind === 'valid' ? JSON.stringify(exampleOf(r)) : kind === 'form' ? 'a=1&b[c]=2&__proto__[admin]=1' : kind;
          const req = json(r, body, { 'content-type': contentType });
          if (contentType === '') delete req.headers['content-type'];
          await probe(req);
        },
      ),
      { numRuns: 200 },
    );
  });

  it('headers: Idempotency-Key, Authorization and X-Request-Id of any shape', async () => {
    const latin1 = fc.string({
      unit: fc
        .integer({ min: 0x20, max: 0xff })
        .filter((c) => c !== 0x7f)
        .map((c) => String.fromCharCode(c)),
      maxLength: 300,
    });
    const key = fc.oneof(
      fc.stringMatching(/^[A-Za-z0-9_-]{1,128}$/),
      fc.constantFrom('', ' ', 'a'.repeat(129), "k' OR 1=1 --", 'k;DROP TABLE user_coupon', '../../etc', 'k%00', 'ключ'),
      fc.constant(long('5,000 a', 'a'.repeat(5000))),
      latin1,
    );
    const auth = fc.oneof(
      fc.constant(`Bearer ${tokenFor(USER)}`),
      fc.constant(`Bearer ${adminToken()}`),
      latin1.map((s) => `Bearer ${s}`),
      latin1,
      fc.constant(`bearer ${tokenFor(USER)}`),
    );
    const grab = routes.find((r) => r.path === '/coupons/{couponId}/grab') as Route;
    await fc.assert(
      fc.asyncProperty(key, auth, fc.option(latin1), fc.boolean(), async (generatedKey, authorization, requestId, grabNotLookup) => {
        const k = textOf(generatedKey);
        const headers: Record<string, string> = { authorization, 'idempotency-key': k };
        if (requestId !== null) headers['x-request-id'] = requestId;
        const path = grabNotLookup ? urlOf(grab) : `/grabs/${encodeURIComponent(k)}`;
        await probe({ method: grabNotLookup ? 'POST' : 'GET', path, headers });
      }),
      { numRuns: 400 },
    );
  });

  it('paths: odd ids and segments on every route, and methods the route does not have', async () => {
    const segment = fc.oneof(
      fc.constantFrom(
        '0',
        '-1',
        '1.5',
        '1e3',
        '00001',
        '+1',
        '0x1F',
        ' 1',
        '%201',
        '%00',
        '..',
        '%2e%2e',
        '%2F',
        'null',
        'undefined',
        "1'%20OR%20'1'='1",
        '1;DROP%20TABLE%20coupon',
        '99999999999999999999',
        '9223372036854775808',
        '9223372036854775807',
        '18446744073709551615',
        '%D9%A3',
        '%EF%BC%91',
        '%F0%9F%99%82',
      ),
      fc.constant(long('600 a', 'a'.repeat(600))),
      fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }).map(String),
      fc.string({ unit: 'grapheme', maxLength: 40 }).map(encodeURIComponent),
      fc.webSegment(),
    );
    const suffix = fc.constantFrom('', '/', '//', '/extra', '/..', '?', '#x', '/%2e%2e/%2e%2e/admin/coupons');
    const method = fc.constantFrom('GET', 'POST', 'PATCH', 'PUT', 'DELETE', 'OPTIONS', 'HEAD');
    await fc.assert(
      fc.asyncProperty(fc.nat(), segment, suffix, fc.option(method, { freq: 3 }), async (pick, generatedSegment, tail, otherMethod) => {
        const r = routes[pick % routes.length];
        const seg = textOf(generatedSegment);
        const path = r.path.includes('{')
          ? urlOf(r, Object.fromEntries([...r.path.matchAll(/\{(\w+)\}/g)].map((m) => [m[1], seg])))
          : `${urlOf(r)}/${seg}`;
        const body = r.method === 'get' ? undefined : JSON.stringify(exampleOf(r));
        const req = json(r, body);
        req.path = path + tail;
        if (otherMethod) req.method = otherMethod;
        if (req.method === 'GET' || req.method === 'HEAD') {
          delete req.body;
          delete req.headers['content-type'];
        }
        await probe(req);
      }),
      { numRuns: 500 },
    );
  });

  it('query strings: wrong types, repeats, arrays, pollution keys and unicode', async () => {
    const getRoutes = routes.filter((r) => r.method === 'get');
    const key = fc.oneof(
      fc.constantFrom(
        'status',
        'limit',
        'cursor',
        'runId',
        'status[]',
        'limit[0]',
        'cursor[a]',
        '__proto__[admin]',
        '__proto__',
        'constructor[prototype][admin]',
        'constructor',
        'hasOwnProperty',
        'toString',
        '',
      ),
      fc.string({ maxLength: 12 }),
    );
    const value = fc.oneof(
      fc.constantFrom(
        'UNUSED',
        'EXPIRED',
        'OPEN',
        'PENDING',
        'used',
        '0',
        '101',
        '-1',
        '1e400',
        '1.5',
        '20abc',
        '0x10',
        '1e2',
        '+5',
        ' 5',
        '9223372036854775808',
        '99999999999999999999',
        '',
        "' OR 1=1 --",
        'true',
        '[]',
        '{}',
      ),
      fc.integer().map(String),
      fc.string({ unit: 'grapheme', maxLength: 30 }),
    );
    await fc.assert(
      fc.asyncProperty(fc.nat(), fc.array(fc.tuple(key, value), { maxLength: 5 }), fc.boolean(), async (pick, pairs, encode) => {
        const r = getRoutes[pick % getRoutes.length];
        const enc = (s: string) => (encode ? encodeURIComponent(s) : encodeURI(s));
        const query = pairs.map(([k, v]) => `${enc(k)}=${enc(v)}`).join('&');
        const req = json(r, undefined);
        req.path = `${urlOf(r)}?${query}`;
        const a = await probe(req);
        // Fully encoded, every pair arrives as generated: on a route with query parameters, a prototype name or a limit other than digits must be refused.
        const loose =
          encode &&
          r.query.length > 0 &&
          pairs.find(([k, v]) => k in Object.prototype || (k === 'limit' && r.query.includes(k) && !/^[0-9]+$/.test(v)));
        if (a && a.status < 400 && loose) throw new Error(`accepted query field ${loose[0]}=${loose[1]}: ${req.path}`);
      }),
      { numRuns: 400 },
    );
    expect(Object.keys(Object.prototype)).toEqual([]);
  });

  describe('what the fuzzer found, pinned', () => {
    const nested = (depth: number) => `{"reason":${'['.repeat(depth)}${']'.repeat(depth)}}`;

    it.each([100, 5000, 20_000])('a body field nested %i deep answers 400 VALIDATION_FAILED', async (depth) => {
      const a = await probe(json({ method: 'post', path: '/admin/user-coupons/{userCouponId}/void', query: [] }, nested(depth)));
      expect([a?.status, a && (JSON.parse(a.text) as { code: string }).code]).toEqual([400, 'VALIDATION_FAILED']);
    });

    it.each([
      ['a path parameter of 600 characters', `/grabs/${'a'.repeat(600)}`],
      ['an id of 600 digits', `/me/coupons/${'1'.repeat(600)}`],
      ['a broken percent-encoding', '/me/coupons/%E0%A4%A'],
      ['an encoded NUL', '/grabs/%00'],
    ])('%s answers 400 VALIDATION_FAILED in the error format', async (_, path) => {
      const a = await probe({ method: 'GET', path, headers: { authorization: `Bearer ${tokenFor(USER)}` } });
      expect([a?.status, a && (JSON.parse(a.text) as { code: string }).code]).toEqual([400, 'VALIDATION_FAILED']);
    });
  });

  it('after all of it the database is consistent', async () => {
    expect(await checkInvariants(t.db)).toEqual([]);
    expect(stats.requests).toBeGreaterThan(3000);
  });
});
