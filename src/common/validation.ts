import type { IncomingMessage } from 'node:http';
import type { Type as ClassType } from '@nestjs/common';
import {
  applyDecorators,
  ArgumentMetadata,
  CanActivate,
  ExecutionContext,
  Injectable,
  PipeTransform,
  ValidationError,
  ValidationPipe,
} from '@nestjs/common';
import { ROUTE_ARGS_METADATA } from '@nestjs/common/constants.js';
import { RouteParamtypes } from '@nestjs/common/enums/route-paramtypes.enum.js';
import { Transform } from 'class-transformer';
import { buildMessage, IsISO8601, IsString, Matches, ValidateBy, ValidateIf, ValidationOptions } from 'class-validator';
import type { FastifyRequest } from 'fastify';
import { ApiPropertyOptional } from '@nestjs/swagger';
import { AppError } from './errors.js';

/**
 * A value that is not an integer fails the range checks too (they refuse non-numbers): beside the
 * type's message they only mislead, as `orderAmountCents=abc` told 'must not be greater than 1e12'.
 */
const RANGE_CHECKS = ['min', 'max'];

function messagesOf(constraints: Record<string, string>): string[] {
  const wrongType = 'isInt' in constraints || 'isNumber' in constraints;
  return Object.entries(constraints)
    .filter(([name]) => !(wrongType && RANGE_CHECKS.includes(name)))
    .map(([, message]) => message);
}

function flatten(errors: ValidationError[], prefix = ''): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const e of errors) {
    const path = prefix ? `${prefix}.${e.property}` : e.property;
    if (e.constraints) out[path] = messagesOf(e.constraints);
    Object.assign(out, flatten(e.children ?? [], path));
  }
  return out;
}

export function validationFailed(fields: Record<string, unknown>, message = 'Request validation failed'): AppError {
  return new AppError('VALIDATION_FAILED', message, { fields });
}

/** Validated instances of the query classes marked @SharedQuery(), by query: see there. */
const sharedQueries = new WeakMap<object, Map<string, unknown>>();

/**
 * Marks a query DTO whose validated (frozen) instance is shared by every request with the same
 * query: on a public page reloaded by a crowd, validating the same `limit=20` again was a seventh of
 * the route's CPU. Only for handlers that read their query and never change it.
 */
export const SharedQuery = (): ClassDecorator => (target) => {
  sharedQueries.set(target, new Map());
};

/** The validated instance of a @SharedQuery() class for this query, if the pipe has made one; else undefined. */
export function validatedSharedQuery<T>(type: new () => T, query: unknown): Readonly<T> | undefined {
  return sharedQueries.get(type)?.get(JSON.stringify(query)) as Readonly<T> | undefined;
}

/**
 * The global pipe: DTO classes validate bodies and queries, unknown fields are refused, and a body
 * that is not a JSON object (array, string, missing) is refused before class-transformer sees it.
 */
@Injectable()
export class StrictValidationPipe extends ValidationPipe {
  constructor() {
    super({
      whitelist: true,
      forbidNonWhitelisted: true,
      transform: true,
      forbidUnknownValues: true,
      stopAtFirstError: false,
      exceptionFactory: (errors) => validationFailed(flatten(errors)),
    });
  }

  override async transform(value: unknown, metadata: ArgumentMetadata): Promise<unknown> {
    const isDto = typeof metadata.metatype === 'function' && ![String, Number, Boolean, Object, Array].includes(metadata.metatype as never);
    if (isDto && (metadata.type === 'body' || metadata.type === 'query')) {
      if (value === undefined && metadata.type === 'body') throw validationFailed({ body: ['a JSON object body is required'] });
      if (typeof value !== 'object' || value === null || Array.isArray(value)) {
        throw validationFailed({ [metadata.type]: ['must be a JSON object'] });
      }
      if (depthExceeds(value, MAX_DEPTH)) throw validationFailed({ [metadata.type]: [`nested deeper than ${MAX_DEPTH} levels`] });
      const prototypeNamed = prototypeNamedFields(value);
      if (prototypeNamed.length > 0) {
        throw validationFailed(Object.fromEntries(prototypeNamed.map((path) => [path, [`property ${path} should not exist`]])));
      }
      const shared = metadata.type === 'query' ? sharedQueries.get(metadata.metatype as object) : undefined;
      if (shared) {
        const key = JSON.stringify(value);
        const known = shared.get(key);
        if (known) return known;
        const validated = Object.freeze(await super.transform(value, metadata));
        // Only what crowds send repeats; anything else would grow the map without ever being met again.
        if (shared.size >= 1000) shared.clear();
        shared.set(key, validated);
        return validated;
      }
    }
    return super.transform(value, metadata);
  }
}

/**
 * A body that may be absent: a POST with no body gets the DTO's defaults, anything sent is
 * validated as strictly as every other body, so a JSON `null` is 400 `body` as on any other route
 * (it is a body, not the absence of one). (The global pipe requires a body for DTO-typed
 * parameters, so the handler types its parameter with an interface and lets this pipe do the work.)
 */
@Injectable()
export class OptionalBodyPipe<T extends object> implements PipeTransform<unknown, Promise<T>> {
  private readonly strict = new StrictValidationPipe();

  constructor(private readonly dto: ClassType<T>) {}

  async transform(value: unknown, metadata: ArgumentMetadata): Promise<T> {
    if (value === undefined) return new this.dto();
    return (await this.strict.transform(value, { ...metadata, metatype: this.dto })) as T;
  }
}

/** Whether the request says a body follows (on a GET, where Fastify parses none, the only sign of one). */
export function announcesBody({ headers }: Pick<IncomingMessage, 'headers'>): boolean {
  return headers['transfer-encoding'] !== undefined || Number(headers['content-length'] ?? 0) > 0;
}

/** uri-host [":" port] (RFC 9110 7.2): an IP literal in brackets, or a reg-name (letters, digits, unreserved, sub-delims, %-escapes). */
const HOST_VALUE = /^(?:\[[0-9A-Za-z:.%~_-]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::\d*)?$/;

/**
 * Why the request's Host is not one (RFC 9112 3.2: 400 for two Host lines or an invalid one), or
 * null. Node keeps the first of two and drops the other, so a proxy reading the second would have
 * served another host than this service saw.
 */
export function hostProblem({ headers, rawHeaders }: Pick<IncomingMessage, 'headers' | 'rawHeaders'>): string | null {
  let lines = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) if (rawHeaders[i].length === 4 && rawHeaders[i].toLowerCase() === 'host') lines++;
  if (lines > 1) return 'is sent more than once';
  if (headers.host !== undefined && !HOST_VALUE.test(headers.host)) return 'is not a host name or address with an optional port';
  return null;
}

/** The bytes of each chunked body sent on a GET or HEAD, counted as they arrived (json-body.ts). */
const bodylessChunkedBytes = new WeakMap<IncomingMessage, number>();

export function noteBodylessChunkedBytes(req: IncomingMessage, bytes: number): void {
  bodylessChunkedBytes.set(req, bytes);
}

/** Whether a GET or HEAD sent a body: a chunked one that ended before its first byte is none, as on other methods. */
function sentBodyWithoutParser(request: FastifyRequest): boolean {
  if (request.headers['transfer-encoding'] === undefined) return announcesBody(request);
  return (bodylessChunkedBytes.get(request.raw) ?? 1) > 0;
}

/** What a handler takes besides its path: read once per handler from its parameter decorators. */
interface DeclaredInput {
  /** 'dto' when the handler validates its whole query with a DTO, else the names it reads one by one. */
  query: ReadonlySet<string> | 'dto';
  /** Whether it reads a body: a @Body() parameter, or the raw request (the bulk upload streams its own). */
  body: boolean;
}

/**
 * The pipe only sees the query and body of a handler that declares them, so `GET /coupons/1?x=1`,
 * `/health?x=1` or a grab sent with `{"x": 1}` had the input ignored where API.md makes an
 * unexpected field a 400 like an unknown body field. A route without a body takes none, or an empty
 * object (what some clients send with every POST). Registered after the auth guard, so a caller
 * without a token still hears 401 first, as with a bad body. A guard rather than an interceptor:
 * any interceptor puts every request through an RxJS chain, which a grab keeps alive while it
 * waits for its group; copying those chains in the young-generation collections held the grouped
 * grab back by about a fifth (BENCHMARKS.md).
 */
@Injectable()
export class UndeclaredInputGuard implements CanActivate {
  private readonly declared = new WeakMap<object, DeclaredInput>();

  canActivate(context: ExecutionContext): true {
    const request = context.switchToHttp().getRequest<FastifyRequest>();
    const { query, body } = request;
    const names = typeof query === 'object' && query !== null ? Object.keys(query) : [];
    // Fastify parses no body on a GET or HEAD: one sent is only seen in the headers that announce it.
    // On other methods the parsers ran, and undefined is an empty body (chunked ones included).
    const unparsed = request.method === 'GET' || request.method === 'HEAD';
    const bodyGiven = body !== undefined ? !isEmptyObject(body) : unparsed && sentBodyWithoutParser(request);
    if (names.length === 0 && !bodyGiven) return true;
    const declared = this.declaredInput(context);
    const reads = declared.query;
    const unknown = reads === 'dto' ? [] : names.filter((name) => !reads.has(name));
    // No GET reads a body, also one that takes the raw request (/metrics).
    const unwanted = bodyGiven && (unparsed || !declared.body);
    if (unwanted && isPlainObject(body)) unknown.push(...Object.keys(body));
    const fields: [string, string[]][] = unknown.map((name) => [name, [`property ${name} should not exist`]]);
    // No query takes a list: `limit=1&limit=2` arrives as one, which the DTO's checks would call "not an integer".
    for (const name of names)
      if (!unknown.includes(name) && Array.isArray((query as Record<string, unknown>)[name]))
        fields.push([name, [`${name} is given more than once`]]);
    if (unwanted && !isPlainObject(body)) fields.push(['body', ['this route takes no body']]);
    // fromEntries: a field named __proto__ is listed as one, where an assignment would set the prototype.
    if (fields.length > 0) throw validationFailed(Object.fromEntries(fields));
    return true;
  }

  private declaredInput(context: ExecutionContext): DeclaredInput {
    const handler = context.getHandler();
    let declared = this.declared.get(handler);
    if (declared === undefined) {
      const args = Object.entries(
        (Reflect.getMetadata(ROUTE_ARGS_METADATA, context.getClass(), handler.name) ?? {}) as Record<string, { data?: unknown }>,
      ).map(([key, arg]) => ({ type: Number(key.split(':')[0]), data: arg.data }));
      const queryArgs = args.filter((a) => a.type === RouteParamtypes.QUERY).map((a) => a.data);
      declared = {
        query: queryArgs.some((data) => typeof data !== 'string') ? 'dto' : new Set(queryArgs as string[]),
        body: args.some((a) => a.type === RouteParamtypes.BODY || a.type === RouteParamtypes.REQUEST),
      };
      this.declared.set(handler, declared);
    }
    return declared;
  }
}

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
export const isEmptyObject = (v: unknown) => isPlainObject(v) && Object.keys(v).length === 0;

/** Deeper than any DTO of this API; deeper input would only exhaust class-transformer's recursion. */
const MAX_DEPTH = 16;

function depthExceeds(value: unknown, limit: number): boolean {
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [v, d] = stack.pop() as [unknown, number];
    if (typeof v !== 'object' || v === null) continue;
    if (d >= limit) return true;
    for (const child of Object.values(v)) stack.push([child, d + 1]);
  }
  return false;
}

/**
 * class-validator's whitelist looks field names up in a plain object, so `constructor`,
 * `hasOwnProperty`, `__proto__` and the other names Object.prototype carries counted as declared
 * fields and slipped past forbidNonWhitelisted. No DTO declares such a field, so any of them, at
 * any depth, is an unknown field.
 */
const PROTOTYPE_NAMES = new Set(Object.getOwnPropertyNames(Object.prototype));

function prototypeNamedFields(value: unknown, prefix = ''): string[] {
  if (typeof value !== 'object' || value === null) return [];
  return Object.entries(value).flatMap(([key, child]) => {
    const path = prefix ? `${prefix}.${key}` : key;
    return PROTOTYPE_NAMES.has(key) ? [path] : prototypeNamedFields(child, path);
  });
}

const digitRange = (lo: number, hi: number) => (lo === hi ? String(lo) : `[${lo}-${hi}]`);
const anyDigits = (n: number) => (n === 1 ? '[0-9]' : `[0-9]{${n}}`);

/**
 * A regex source matching exactly the decimal numbers 1..`max` without leading zeros. A regex rather
 * than a BigInt comparison so the OpenAPI document can state the same bound as the validators.
 */
export function decimalUpTo(max: bigint): string {
  if (max < 1n) throw new RangeError(`decimalUpTo needs a positive bound, not ${max}`);
  const digits = [...max.toString()].map(Number);
  const n = digits.length;
  // The numbers of max's length from digit i on: a smaller digit there and anything after, or max's digit and the rest again.
  const sameLength = (i: number): string[] => {
    const lo = i === 0 ? 1 : 0;
    const d = digits[i];
    if (i === n - 1) return [digitRange(lo, d)];
    const rest = sameLength(i + 1);
    const below = d > lo ? [`${digitRange(lo, d - 1)}${anyDigits(n - i - 1)}`] : [];
    return [...below, `${d}${rest.length === 1 ? rest[0] : `(?:${rest.join('|')})`}`];
  };
  const shorter = n === 1 ? [] : [n === 2 ? '[1-9]' : `[1-9][0-9]{0,${n - 2}}`];
  return `^(?:${[...shorter, ...sameLength(0)].join('|')})$`;
}

/**
 * Ids are positive 64-bit integers (1..2^63-1, the BIGINT columns), kept as strings end to end: one
 * pattern for path ids, body and query ids and cursors, and the OpenAPI document.
 */
export const ID_PATTERN = new RegExp(decimalUpTo(9223372036854775807n));

/** Path ids are positive 64-bit integers, kept as strings end to end. */
@Injectable()
export class IdPipe implements PipeTransform<string, string> {
  transform(value: string, metadata: ArgumentMetadata): string {
    if (typeof value !== 'string' || !ID_PATTERN.test(value)) {
      throw validationFailed({ [metadata.data ?? 'id']: ['must be a positive integer id'] });
    }
    return value;
  }
}

// Ids travel as strings (API.md); a client sending a plain JSON integer gets the same meaning.
const idAsString = ({ value }: { value: unknown }) => (typeof value === 'number' && Number.isSafeInteger(value) ? String(value) : value);

/** A body or query field holding an id (a cursor is one too). */
export const IsId = (message = '$property must be a positive integer id') =>
  applyDecorators(Transform(idAsString), IsString(), Matches(ID_PATTERN, { message }));

/**
 * A point in time: ISO 8601 with its zone (`Z` or `±hh:mm`). A time without one
 * (`2026-12-12T20:00:00`, `2026-12-12`) is refused rather than read as UTC: an operator in UTC+8
 * who meant local time would get a sale eight hours off.
 */
export const IsInstant = () =>
  applyDecorators(
    IsISO8601({ strict: true }),
    Matches(/T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})$/, { message: '$property must be a time with its zone (Z or ±hh:mm)' }),
  );

export const USER_ID_PATTERN = /^[A-Za-z0-9_.:-]{1,64}$/;
/** A user id field: 1-64 of [A-Za-z0-9_.:-]. */
export const IsUserId = () => applyDecorators(IsString(), Matches(USER_ID_PATTERN, { message: 'userId must be 1-64 of [A-Za-z0-9_.:-]' }));
/** The user a request acts for: a service token must name one, a user token may name only itself (checked by the service). */
export const ActingForUserId = () =>
  applyDecorators(
    ApiPropertyOptional({ description: 'Required for a service token; for a user token absent or equal to the token subject' }),
    IsOmittable(),
    IsUserId(),
  );
/** The largest amount in cents any field takes: well within the columns' and JSON's exact integers. */
export const MAX_CENTS = 1_000_000_000_000;
export const IDEMPOTENCY_KEY_PATTERN = /^[A-Za-z0-9_-]{1,128}$/;

/** An Idempotency-Key header (or path segment) as API.md defines it, else 400 naming `field`. */
export function checkIdempotencyKey(key: string | undefined, field: string, maxLength = 128): string {
  if (typeof key !== 'string' || !IDEMPOTENCY_KEY_PATTERN.test(key) || key.length > maxLength) {
    throw validationFailed({ [field]: [`required: 1-${maxLength} characters of [A-Za-z0-9_-]`] });
  }
  return key;
}

/**
 * The field may be left out, but when present it is validated, null included. class-validator's
 * IsOptional() also lets null through, which for a NOT NULL column became a 500; use IsOptional()
 * only where null means something.
 */
export const IsOmittable = () => ValidateIf((_object: object, value: unknown) => value !== undefined);

/**
 * An integer in a query string: plain decimal digits only. Number() (what @Type(() => Number) does)
 * also reads 0x10 as 16, 1e2 as 100, and accepts +5 and ' 5'; anything but digits stays a string
 * and fails @IsInt().
 */
export const QueryInt = () =>
  Transform(({ value }: { value: unknown }) => (typeof value === 'string' && /^[0-9]{1,15}$/.test(value) ? Number(value) : value));

/** Unicode code points in `s`, counting stops once past `max` (a lone surrogate counts as one; TextLength refuses it anyway). */
function codePointsUpTo(s: string, max: number): number {
  let n = 0;
  for (let i = 0; i < s.length && n <= max; i++, n++) {
    const unit = s.charCodeAt(i);
    if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < s.length) {
      const next = s.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) i++;
    }
  }
  return n;
}

// With the u flag a surrogate pair is one code point, so only a lone half matches.
export const LONE_SURROGATE = /\p{Cs}/u;

/**
 * A string of `min`..`max` Unicode code points: the unit utf8mb4 VARCHAR(n) columns count, so a text
 * that passes always fits a column of `max`. The one length check for every bounded text field:
 * class-validator's Length/MaxLength count neither code points nor UTF-16 units (a surrogate pair
 * and a variation selector both count as nothing extra), so 64 "a\uFE0F" passed as 64 characters
 * and overflowed VARCHAR(64) as a 500. A lone surrogate (JSON allows "\ud800") is refused: the
 * column would store it as U+FFFD while the answer echoed the original.
 */
export function TextLength(min: number, max: number, options?: ValidationOptions): PropertyDecorator {
  const wellFormed = ValidateBy(
    {
      name: 'wellFormedText',
      validator: {
        validate: (value: unknown) => typeof value !== 'string' || !LONE_SURROGATE.test(value),
        defaultMessage: buildMessage((each) => `${each}$property must be valid Unicode text (no lone surrogate)`, options),
      },
    },
    options,
  );
  const length = ValidateBy(
    {
      name: 'textLength',
      constraints: [min, max],
      validator: {
        validate: (value: unknown) => {
          if (typeof value !== 'string') return false;
          const n = codePointsUpTo(value, max);
          return n >= min && n <= max;
        },
        defaultMessage: buildMessage(
          (each) => `${each}$property must be $constraint1 to $constraint2 characters (Unicode code points)`,
          options,
        ),
      },
    },
    options,
  );
  return (target, property) => {
    length(target, property);
    wellFormed(target, property);
  };
}

/** What makes stored text show as something else: control characters, bidi embeddings, overrides and isolates. */
const HIDDEN = String.raw`\p{Cc}\u202A-\u202E\u2066-\u2069`;

/**
 * Shown to shoppers: some visible text, no control characters (a bell, a line feed) and no bidi
 * embeddings, overrides or isolates (U+202E made "exe.png" read "gnp.exe"); a name of zero-width
 * characters alone showed as nothing to click. Emoji sequences (their joiners) are fine.
 */
export const DISPLAY_NAME = new RegExp(String.raw`^(?![\s\p{Cf}]*$)[^${HIDDEN}]+$`, 'u');

/** Operator text shown as written, possibly empty (a webhook's description): none of what DISPLAY_NAME refuses in it. */
export const DISPLAY_TEXT = new RegExp(String.raw`^[^${HIDDEN}]*$`, 'u');

/**
 * Not blank, and no control characters but tabs and line breaks (a NUL cut the text short for C
 * readers of the log). Spelled out, not \p{Cc}: the pattern goes into the OpenAPI document, which
 * clients read without the u flag.
 */
// eslint-disable-next-line no-control-regex -- matching control characters is the point
const REASON = /^(?!\s*$)[^\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F]+$/;

/** An operator's reason, written to the state log or a decision: 1..max code points of visible text. */
export const ReasonText = (max: number) =>
  applyDecorators(
    IsString(),
    TextLength(1, max),
    Matches(REASON, { message: '$property must be text that is not blank, without control characters but tabs and line breaks' }),
  );
