import createClient, { type Middleware } from 'openapi-fetch';
import type { components, paths } from '../../client/schema';
import { clearToken, storedToken } from './auth';

/** The API's error body: `{code, message, details?}`; validation errors carry `details.fields`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details?: { fields?: Record<string, string[]> } & Record<string, unknown>,
  ) {
    super(message);
  }
}

type Listener = () => void;
let onUnauthenticated: Listener = () => {};
/** Called when the server answers 401: the token expired or was revoked, so the console returns to sign-in. */
export function setUnauthenticatedListener(listener: Listener): void {
  onUnauthenticated = listener;
}

let language = 'en';
/** The API answers its error messages in this language (Accept-Language), the one the console shows. */
export function setApiLanguage(lang: string): void {
  language = lang;
}

/** The language the console speaks, as the API is asked for it. */
export const apiLanguage = (): string => language;

const session: Middleware = {
  onRequest({ request }) {
    const token = storedToken();
    if (token) request.headers.set('authorization', `Bearer ${token}`);
    request.headers.set('accept-language', language);
    return request;
  },
  onResponse({ response }) {
    if (response.status === 401) {
      clearToken();
      onUnauthenticated();
    }
    return response;
  },
};

/** The client generated from the service's OpenAPI document (client/schema.d.ts): paths, parameters and bodies are checked at compile time. */
export const client = createClient<paths>({ baseUrl: window.location.origin });
client.use(session);

/**
 * A new Idempotency-Key. Not crypto.randomUUID: browsers give it only to secure contexts (HTTPS or
 * localhost), and the console is also opened over plain HTTP by address; getRandomValues exists in both.
 */
export function newIdempotencyKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}`;
}

/**
 * A fetch for the typed client's `fetch` option that sends with XMLHttpRequest, the one browser API
 * that reports how much of a request body went up: `onProgress(fraction)` as it goes. The request is
 * the client's (URL, headers, body, after the middleware), and the answer a Response as fetch gives it,
 * so ok() and the 401 handling treat it as any other; a network failure rejects as fetch's does.
 */
export function fetchWithUploadProgress(onProgress: (fraction: number) => void): (request: Request) => Promise<Response> {
  return async (request) => {
    const body = await request.blob();
    return new Promise<Response>((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open(request.method, request.url);
      request.headers.forEach((value, name) => xhr.setRequestHeader(name, value));
      xhr.responseType = 'blob';
      xhr.upload.onprogress = (e) => {
        if (e.lengthComputable && e.total > 0) onProgress(e.loaded / e.total);
      };
      xhr.onload = () => {
        const headers = new Headers();
        for (const line of xhr
          .getAllResponseHeaders()
          .trim()
          .split(/[\r\n]+/)) {
          const colon = line.indexOf(':');
          if (colon > 0) headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
        }
        // A Response refuses a body with these statuses, even an empty one.
        const body = [204, 205, 304].includes(xhr.status) ? null : (xhr.response as Blob);
        resolve(new Response(body, { status: xhr.status, statusText: xhr.statusText, headers }));
      };
      xhr.onerror = () => reject(new TypeError('Failed to fetch'));
      xhr.onabort = () => reject(new DOMException('The upload was aborted', 'AbortError'));
      xhr.send(body);
    });
  };
}

/**
 * The answer's body, or an ApiError with the API's code, message and details. Its message names the
 * fields a validation error lists, so a page that shows only the message still says what was wrong
 * ("Request validation failed" alone left an operator guessing at a bad user id).
 */
export async function ok<T>(call: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
  const { data, error, response } = await call;
  if (response.ok) return data as T;
  const err = (error ?? {}) as { code?: string; message?: string; details?: ApiError['details'] };
  const fields = Object.entries(err.details?.fields ?? {}).map(([name, problems]) => `${name}: ${problems.join(', ')}`);
  const message = [err.message ?? response.statusText, ...fields].join(' · ');
  throw new ApiError(response.status, err.code ?? `HTTP_${response.status}`, message, err.details);
}

type Schemas = components['schemas'];
export type Coupon = Schemas['AdminCoupon'];
export type CouponView = Schemas['Coupon'];
export type Counts = Schemas['CouponCounts'];
export type Series = Schemas['CouponSeriesView'];
export type UserCoupon = Schemas['UserCoupon'];
export type UserCouponStatus = UserCoupon['status'];
export type History = Schemas['UserCouponHistory'];
export type Run = Schemas['Run'];
export type RunWithCounts = Schemas['RunWithCounts'];
export type Compensation = Schemas['Compensation'];
export type Webhook = Schemas['WebhookView'];
export type CreatedWebhook = Schemas['CreatedWebhookView'];
export type Delivery = Schemas['DeliveryView'];
export type IssuanceJob = Schemas['IssuanceJobView'];
export type SkippedLine = Schemas['SkippedLineView'];
