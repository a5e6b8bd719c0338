import type { INestApplication } from '@nestjs/common';
import { DocumentBuilder, type OpenAPIObject, SwaggerModule } from '@nestjs/swagger';
import { ERROR_STATUS, type ErrorCode } from '../common/errors.js';
import { ID_PATTERN, USER_ID_PATTERN } from '../common/validation.js';
import { ROUTES, type RouteContract } from './routes.js';
import { describeValidatedProperties } from './validated-properties.js';
import { WEBHOOK_EVENT_SCHEMA, webhooksSection } from './webhooks.js';
import { HEADERS, type HeaderName, IDEMPOTENCY_KEY_SCHEMA, type JsonSchema, ref, RESPONSE_SCHEMAS } from './schemas.js';
import { PatchCouponDto } from '../coupon/coupon.dto.js';
import { UpdateWebhookDto } from '../webhooks/webhook.dto.js';

export const API_VERSION = '0.1.0';
const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const;
/** A path parameter named `id` or `<thing>Id` (a user id aside) holds a row id: so a route added later cannot be left without the pattern. */
const isIdParam = (name: string) => name === 'id' || (name.endsWith('Id') && name !== 'userId');

/** One line per @ApiTags name used by a controller. */
const TAGS: Record<string, string> = {
  coupons: 'Coupon templates as shoppers see them',
  grab: 'Grabbing a coupon, and finding out what a grab did',
  me: "The caller's own coupons",
  redemptions: 'Using coupons on orders, and refunds (order service)',
  admin: 'Operators: templates, stock, user coupons',
  reconciliation: 'Operators: audits, discrepancies and their compensations',
  operations: 'Health and metrics',
};

interface Parameter {
  name: string;
  in: string;
  required?: boolean;
  description?: string;
  schema?: JsonSchema;
}
interface Operation {
  summary?: string;
  description?: string;
  parameters?: Parameter[];
  requestBody?: { content?: Record<string, { schema?: JsonSchema; example?: unknown }> };
  responses?: Record<string, unknown>;
  security?: Record<string, string[]>[];
  tags?: string[];
  [extension: `x-${string}`]: unknown;
}

/** The codes every route of its kind can answer, besides its own (ROUTES[...].errors). */
function commonErrors(method: string, route: RouteContract): ErrorCode[] {
  // Any request: it did not all arrive within REQUEST_TIMEOUT_MS (a slow body, or slow headers
  // answered by the HTTP server before routing), or its headers are too large.
  // Any route refuses a query parameter or a body field it does not declare (UndeclaredInputGuard).
  // Any body over the limit, a GET's included (json-body.ts).
  const codes: ErrorCode[] = ['REQUEST_TIMEOUT', 'HEADERS_TOO_LARGE', 'VALIDATION_FAILED', 'PAYLOAD_TOO_LARGE'];
  const takesBody = method === 'post' || method === 'patch' || method === 'put' || method === 'delete';
  if (route.auth !== 'public') codes.push('UNAUTHENTICATED');
  if (Array.isArray(route.auth)) codes.push('FORBIDDEN');
  if (takesBody) codes.push('UNSUPPORTED_MEDIA_TYPE');
  // Whatever the route: a request that arrives while the instance shuts down (app.factory.ts); and a database outage.
  codes.push('SERVICE_UNAVAILABLE');
  // Every write commits through TransactionService, which answers this when a lost COMMIT cannot be resolved.
  if (route.usesDatabase !== false && method !== 'get') codes.push('OUTCOME_UNKNOWN');
  return codes;
}

function headers(names: readonly HeaderName[], required: readonly HeaderName[] = []): Record<string, unknown> {
  return Object.fromEntries(
    (['x-request-id', ...names] as HeaderName[]).map((name) => {
      const { required: always, ...header } = { required: false, ...HEADERS[name] };
      return [name, { ...header, required: always || required.includes(name) }];
    }),
  );
}

function errorResponses(codes: ErrorCode[], extra: readonly HeaderName[] = []): Record<string, unknown> {
  const byStatus = new Map<number, ErrorCode[]>();
  for (const code of new Set(codes)) byStatus.set(ERROR_STATUS[code], [...(byStatus.get(ERROR_STATUS[code]) ?? []), code]);
  return Object.fromEntries(
    [...byStatus].map(([status, list]) => [
      String(status),
      {
        description: list.join(', '),
        headers:
          status === 429
            ? headers(['Retry-After', 'Content-Language', ...extra], ['Retry-After'])
            : headers([...(status === 503 ? ['Retry-After' as const] : []), 'Content-Language', ...extra]),
        content: {
          'application/json': {
            schema: { allOf: [ref('Error'), { type: 'object', properties: { code: { type: 'string', enum: list } } }] },
            example: { code: list[0], message: list[0].toLowerCase().replaceAll('_', ' ') },
          },
        },
      },
    ]),
  );
}

function successResponses(route: RouteContract): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(route.ok).map(([status, answer]) => [
      status,
      {
        description: answer.description,
        headers: headers([...(answer.headers ?? []), ...(answer.requiredHeaders ?? [])], answer.requiredHeaders),
        ...(answer.schema === 'none'
          ? {}
          : {
              content:
                answer.schema === 'text'
                  ? { 'text/plain': { schema: { type: 'string' } } }
                  : answer.schema === 'csv'
                    ? { 'text/csv': { schema: { type: 'string' }, example: 'user_id\r\nalice\r\nbob\r\n' } }
                    : { 'application/json': { schema: ref(answer.schema) } },
            }),
      },
    ]),
  );
}

function authText(auth: RouteContract['auth']): string {
  if (auth === 'public') return 'No token needed.';
  if (auth === 'user') return 'Any valid bearer token (a user; `sub` is the user id).';
  return `Bearer token with the role ${auth.map((r) => `\`${r}\``).join(' or ')}.`;
}

/** OpenAPI 3.1 schemas are JSON Schema: the 3.0 `nullable` @nestjs/swagger writes becomes a null type. */
function dropNullable(node: unknown): void {
  if (typeof node !== 'object' || node === null) return;
  const o = node as Record<string, unknown>;
  if (o.nullable === true) {
    delete o.nullable;
    if (typeof o.type === 'string') o.type = [o.type, 'null'];
    if (Array.isArray(o.enum) && !o.enum.includes(null)) o.enum = [...(o.enum as unknown[]), null];
  }
  for (const child of Object.values(o)) dropNullable(child);
}

function applyRoute(method: string, op: Operation, route: RouteContract): void {
  op.summary = route.summary;
  op.description = [route.description, `Auth: ${authText(route.auth)}`].filter(Boolean).join('\n\n');
  op.security = route.auth === 'public' ? [] : [{ bearer: [] }];
  if (Array.isArray(route.auth)) op['x-roles'] = [...route.auth];
  for (const p of op.parameters ?? []) {
    if (p.in === 'path' && isIdParam(p.name)) p.schema = { type: 'string', pattern: ID_PATTERN.source, example: '1' };
    if (p.in === 'path' && p.name === 'userId') p.schema = { type: 'string', pattern: USER_ID_PATTERN.source, example: 'alice' };
    if ((p.in === 'path' && p.name === 'idempotencyKey') || (p.in === 'header' && p.name === 'Idempotency-Key')) {
      p.schema = { ...IDEMPOTENCY_KEY_SCHEMA, ...p.schema, type: 'string' };
    }
  }
  const json = op.requestBody?.content?.['application/json'];
  if (json && route.requestExample !== undefined) json.example = route.requestExample;
  if (route.otherRequestContent && op.requestBody) op.requestBody.content = { ...op.requestBody.content, ...route.otherRequestContent };
  op.responses = { ...successResponses(route), ...errorResponses([...commonErrors(method, route), ...route.errors], route.errorHeaders) };
}

/**
 * An id field of a request body also takes a JSON integer: IsId() turns a safe integer into its
 * digits before checking them (common/validation.ts). Answers carry ids as strings only, so only
 * the schemas request bodies name say so.
 */
function acceptIntegerIds(doc: OpenAPIObject): void {
  const schemas = (doc.components?.schemas ?? {}) as Record<string, JsonSchema>;
  const names = new Set<string>();
  for (const item of Object.values(doc.paths)) {
    for (const method of METHODS) {
      const ref = (item as Record<string, Operation | undefined>)[method]?.requestBody?.content?.['application/json']?.schema?.$ref;
      if (typeof ref === 'string') names.add(ref.replace('#/components/schemas/', ''));
    }
  }
  for (const name of names) {
    for (const property of Object.values((schemas[name]?.properties ?? {}) as Record<string, JsonSchema>)) {
      if (property.type === 'string' && property.pattern === ID_PATTERN.source) {
        Object.assign(property, { type: ['string', 'integer'], minimum: 1, maximum: Number.MAX_SAFE_INTEGER });
      }
    }
  }
}

/**
 * The OpenAPI 3.1 document served at /docs-json and committed as docs/openapi.json: what
 * @nestjs/swagger reads from the controllers and DTOs, completed by the ROUTES table. Operations
 * missing from ROUTES are left as generated; test/openapi.spec.ts fails on them.
 */
export function buildOpenApiDocument(app: INestApplication): OpenAPIObject {
  const config = new DocumentBuilder()
    .setOpenAPIVersion('3.1.0')
    .setTitle('coupon-engine')
    .setDescription(
      'Flash-sale coupons: grab, redeem, refund, reconcile. Every error answer is `{code, message, details?}` with a stable `code`; ' +
        'a 2xx means the change is committed, a 4xx that nothing changed. Ids are strings of digits. The prose contract: docs/api.md. ' +
        'Pages of the origins in CORS_ORIGINS also get `Access-Control-*` headers on every answer and a 204 to their preflights (docs/api.md, Calling from a browser). ' +
        'Every GET operation also answers HEAD, as HTTP defines it: the same status and headers, no body.',
    )
    .setVersion(API_VERSION)
    .setLicense('MIT', 'https://opensource.org/licenses/MIT')
    .addServer('/', 'The instance serving this document (GET /docs-json)')
    .addBearerAuth(
      { type: 'http', scheme: 'bearer', bearerFormat: 'JWT', description: 'HS256 JWT: `sub` user id, `roles`, `exp`' },
      'bearer',
    )
    .build();
  describeValidatedProperties();
  const doc = SwaggerModule.createDocument(app, config);
  // The schemas @nestjs/swagger generates are request DTOs (the validation pipe refuses unknown
  // fields) and view classes (answers carry exactly their properties): all closed.
  for (const schema of Object.values(doc.components?.schemas ?? {})) {
    dropNullable(schema);
    if ((schema as JsonSchema).type === 'object') (schema as JsonSchema).additionalProperties = false;
  }
  // A patch must change something: the services refuse {} (400 naming body).
  for (const dto of [PatchCouponDto, UpdateWebhookDto]) Object.assign(doc.components?.schemas?.[dto.name] ?? {}, { minProperties: 1 });
  const tags = new Set<string>();
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const method of METHODS) {
      const op = (item as Record<string, Operation | undefined>)[method];
      if (!op) continue;
      for (const tag of op.tags ?? []) tags.add(tag);
      dropNullable(op.parameters);
      const route = ROUTES[`${method.toUpperCase()} ${path}`];
      if (route) applyRoute(method, op, route);
    }
  }
  acceptIntegerIds(doc);
  doc.tags = [...tags].sort().map((name) => ({ name, ...(TAGS[name] ? { description: TAGS[name] } : {}) }));
  doc.components = { ...doc.components, schemas: { ...doc.components?.schemas, ...RESPONSE_SCHEMAS, WebhookEvent: WEBHOOK_EVENT_SCHEMA } };
  // @nestjs/swagger's OpenAPIObject predates 3.1's webhooks.
  Object.assign(doc, { webhooks: webhooksSection() });
  return doc;
}
