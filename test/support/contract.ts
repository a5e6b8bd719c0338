import { readFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormatsModule, { type FormatsPlugin } from 'ajv-formats';
import { ERROR_STATUS } from '../../src/common/errors.js';
import { HEADERS } from '../../src/openapi/schemas.js';

/** Headers the service sets itself on some answers (the document's list); each answer that has one must document it. */
// Vary is checked only where documented: with CORS_ORIGINS set, every answer varies by Origin too (docs/api.md).
const SERVICE_HEADERS = Object.keys(HEADERS)
  .map((name) => name.toLowerCase())
  .filter((name) => name !== 'vary');

// ajv-formats is CommonJS with its function on `default` as seen from ESM.
const addFormats = ((addFormatsModule as unknown as { default?: FormatsPlugin }).default ?? addFormatsModule) as FormatsPlugin;

/** A validator holding the OpenAPI document `doc` under `$id`, formats (date-time, uri, ...) checked too. */
export function documentAjv(doc: object, $id: string): Ajv2020 {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  return ajv.addSchema({ ...doc, $id });
}

/** The committed document: what clients generate from, and what every answer is checked against. */
export const OPENAPI_PATH = 'docs/openapi.json';
const DOC_ID = 'https://coupon-engine/openapi.json';
const PAGES = ['/docs', '/console'];

interface Header {
  required?: boolean;
  schema: object;
}
interface Response {
  headers?: Record<string, Header>;
  content?: Record<string, unknown>;
}
interface Operation {
  responses: Record<string, Response>;
  requestBody?: { content?: Record<string, unknown> };
}
type Doc = { paths: Record<string, Record<string, Operation>> };

const pointer = (...segments: string[]) => segments.map((s) => encodeURIComponent(s.replaceAll('~', '~0').replaceAll('/', '~1'))).join('/');

export interface Answer {
  method: string;
  /** Fastify's route pattern (`/coupons/:couponId`), undefined when no route matched. */
  route: string | undefined;
  status: number;
  headers: Record<string, unknown>;
  body: string | Buffer | undefined;
  /** The request's parsed JSON body, when it had one: a body the server accepted (2xx) must match the documented schema. */
  requestBody?: unknown;
}

/**
 * Checks answers against the OpenAPI document: the status is documented for the operation, the body
 * matches that status's schema, and the headers the document requires are present and valid.
 * Schemas compile once, lazily.
 */
export class ContractChecker {
  private readonly doc: Doc;
  private readonly ajv: Ajv2020;
  private readonly compiled = new Map<string, ValidateFunction>();
  /** `METHOD /path status [code]` of every documented answer checked (see contract-coverage.mjs). */
  readonly seen = new Set<string>();

  constructor(path = OPENAPI_PATH) {
    this.doc = JSON.parse(readFileSync(path, 'utf8')) as Doc;
    this.ajv = documentAjv(this.doc, DOC_ID);
  }

  private validator(...segments: string[]): ValidateFunction {
    const ref = `${DOC_ID}#/${pointer(...segments)}`;
    let v = this.compiled.get(ref);
    if (!v) {
      v = this.ajv.compile({ $ref: ref });
      this.compiled.set(ref, v);
    }
    return v;
  }

  /**
   * The operation a concrete path belongs to, as a route pattern (`/coupons/{couponId}`), for
   * answers seen outside the server (raw sockets, the fault suite's client). A literal segment wins
   * over a parameter (`/me/coupons/usable` is not `/me/coupons/{userCouponId}`).
   */
  routeOf(method: string, path: string): string | undefined {
    const segments = path.split('?')[0].split('/');
    const m = method.toLowerCase();
    let best: { route: string; params: number } | undefined;
    for (const [route, item] of Object.entries(this.doc.paths)) {
      if (!item[m]) continue;
      const pattern = route.split('/');
      if (pattern.length !== segments.length) continue;
      let params = 0;
      const fits = pattern.every((p, i) => {
        if (!p.startsWith('{')) return p === segments[i];
        params++;
        return segments[i] !== '';
      });
      if (fits && (!best || params < best.params)) best = { route, params };
    }
    return best?.route;
  }

  private schemaProblems(value: unknown, what: string, ...segments: string[]): string[] {
    const v = this.validator(...segments);
    if (v(value)) return [];
    return [`${what} does not match its schema: ${this.ajv.errorsText(v.errors, { dataVar: what })}`];
  }

  /** Every way the answer departs from the document; empty when it conforms. */
  check(a: Answer): string[] {
    // Fastify's `:param` or the document's `{param}`.
    const path = a.route?.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
    const method = a.method.toLowerCase();
    const op = path ? this.doc.paths[path]?.[method] : undefined;
    // A gzip'd body is checked as the client reads it.
    const text = a.body === undefined ? '' : a.headers['content-encoding'] === 'gzip' ? gunzipSync(a.body).toString() : a.body.toString();
    const contentType = String(a.headers['content-type'] ?? '').split(';')[0];
    if (!op) return this.unroutedProblems(a, text, contentType);
    const response = op.responses[String(a.status)];
    if (!response)
      return [`status ${a.status} is not documented (documented: ${Object.keys(op.responses).join(', ')}); body ${text.slice(0, 300)}`];
    const problems = a.status < 300 ? this.requestProblems(op, path as string, method, a.requestBody) : [];
    for (const [name, header] of Object.entries(response.headers ?? {})) {
      const value = a.headers[name.toLowerCase()];
      if (value === undefined) {
        if (header.required) problems.push(`required header ${name} is missing`);
        continue;
      }
      problems.push(
        ...this.schemaProblems(
          String(value),
          `header ${name}`,
          'paths',
          path as string,
          method,
          'responses',
          String(a.status),
          'headers',
          name,
          'schema',
        ),
      );
    }
    // The headers the service itself sets (Fastify's and Node's are not in the document) must be documented where sent.
    const documented = new Set(Object.keys(response.headers ?? {}).map((name) => name.toLowerCase()));
    for (const name of SERVICE_HEADERS)
      if (a.headers[name] !== undefined && !documented.has(name)) problems.push(`header ${name} is not documented`);
    const media = Object.keys(response.content ?? {});
    if (media.length > 0 && !media.includes(contentType))
      problems.push(`content-type ${contentType} is not documented (${media.join(', ')})`);
    if (contentType !== 'application/json' || !media.includes(contentType)) this.seen.add(`${method.toUpperCase()} ${path} ${a.status}`);
    else {
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch {
        return [...problems, `body is not JSON: ${text.slice(0, 200)}`];
      }
      const code = a.status >= 400 ? (body as { code?: unknown }).code : undefined;
      this.seen.add(`${method.toUpperCase()} ${path} ${a.status}${typeof code === 'string' ? ` ${code}` : ''}`);
      problems.push(
        ...this.schemaProblems(
          body,
          'body',
          'paths',
          path as string,
          method,
          'responses',
          String(a.status),
          'content',
          contentType,
          'schema',
        ),
      );
    }
    return problems;
  }

  /** A JSON request body the server accepted that the document calls invalid: the document is stricter than the code. */
  private requestProblems(op: Operation, path: string, method: string, body: unknown): string[] {
    if (body === undefined || typeof body !== 'object' || body === null || Buffer.isBuffer(body)) return [];
    if (!op.requestBody?.content?.['application/json'])
      // An empty object is what some clients send with every POST; the server takes it as no body.
      return Array.isArray(body) || Object.keys(body).length > 0
        ? ['a JSON request body was accepted by an operation that documents none']
        : [];
    return this.schemaProblems(body, 'request body', 'paths', path, method, 'requestBody', 'content', 'application/json', 'schema').map(
      (p) => `accepted, but ${p}`,
    );
  }

  /** Answers no operation owns (unknown routes, malformed paths) still carry the one error body. */
  private unroutedProblems(a: Answer, text: string, contentType: string): string[] {
    if (a.method === 'HEAD' || a.method === 'OPTIONS') return [];
    // The OpenAPI UI and the operators' console are pages, not API: the document leaves them out.
    if (a.route && !PAGES.some((prefix) => a.route?.startsWith(prefix)))
      return [`route ${a.method} ${a.route} is served but not in the document`];
    if (a.route) return [];
    let body: { code?: string } = {};
    try {
      body = contentType === 'application/json' ? (JSON.parse(text) as { code?: string }) : {};
    } catch {
      /* reported below */
    }
    const problems = this.schemaProblems(body, 'body', 'components', 'schemas', 'Error');
    const expected = body.code ? ERROR_STATUS[body.code as keyof typeof ERROR_STATUS] : undefined;
    if (expected !== a.status) problems.push(`status ${a.status} does not go with code ${body.code ?? '(none)'}`);
    return problems;
  }
}
