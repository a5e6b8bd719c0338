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

export async function api<T>(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<T> {
  const token = storedToken();
  const res = await fetch(path, {
    method,
    headers: {
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      ...headers,
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  const json = text ? (JSON.parse(text) as unknown) : undefined;
  if (!res.ok) {
    const err = (json ?? {}) as { code?: string; message?: string; details?: ApiError['details'] };
    if (res.status === 401) {
      clearToken();
      onUnauthenticated();
    }
    throw new ApiError(res.status, err.code ?? 'HTTP_' + res.status, err.message ?? res.statusText, err.details);
  }
  return json as T;
}

export const get = <T>(path: string) => api<T>('GET', path);
export const post = <T>(path: string, body?: unknown, headers?: Record<string, string>) => api<T>('POST', path, body, headers);
export const patch = <T>(path: string, body: unknown) => api<T>('PATCH', path, body);

export function query(params: Record<string, string | number | undefined | null>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : '';
}

export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export interface Counts {
  issued: number;
  unused: number;
  locked?: number;
  used: number;
  expired: number;
  void: number;
}

export interface Coupon {
  id: string;
  name: string;
  status: 'ACTIVE' | 'PAUSED';
  perUserLimit: number;
  grabStartAt: string;
  grabEndAt: string;
  validity: { type: 'FIXED'; startAt: string; endAt: string } | { type: 'RELATIVE'; days: number };
  discount: { type?: string; thresholdCents: number; amountCents?: number; percentOff?: number; maxDiscountCents?: number };
  rateLimitPerSecond: number | null;
  returnOnRefund: boolean;
  initStock: number;
  remainingStock: number;
  counts?: Counts;
}

export interface Series {
  couponId: string;
  status: Coupon['status'];
  initStock: number;
  remainingStock: number;
  from: string;
  seconds: number;
  outcomes: Record<string, number[]>;
}

export type UserCouponStatus = 'UNUSED' | 'LOCKED' | 'USED' | 'EXPIRED' | 'VOID';

export interface UserCoupon {
  id: string;
  couponId: string;
  userId: string;
  status: UserCouponStatus;
  source: string;
  issuedAt: string;
  validFrom: string;
  expiresAt: string;
  usedAt: string | null;
}

export interface History {
  userCoupon: UserCoupon;
  transitions: { from: UserCouponStatus | null; to: UserCouponStatus; txId: string; reason: string | null; at: string }[];
  replayedStatus: UserCouponStatus | null;
  consistent: boolean;
}

export interface Run {
  id: string;
  status: 'RUNNING' | 'COMPLETED' | 'FAILED';
  mode: 'FULL' | 'INCREMENTAL';
  triggeredBy: string;
  startedAt: string;
  finishedAt: string | null;
  checked: number;
  discrepancies: number;
  error: string | null;
  byType?: Record<string, number>;
}

export interface Compensation {
  id: string;
  status: 'PENDING' | 'DONE' | 'REJECTED';
  action: string;
  params: unknown;
  decidedBy: string | null;
  decisionReason: string | null;
  decidedAt: string | null;
  result: unknown;
  createdAt: string;
  discrepancy: {
    id: string;
    runId: string;
    type: string;
    couponId: string | null;
    userCouponId: string | null;
    redemptionId: string | null;
    details: unknown;
    open: boolean;
    createdAt: string;
  };
}

export interface Webhook {
  id: string;
  url: string;
  events: string[];
  description: string | null;
  enabled: boolean;
  disabledReason: string | null;
  disabledAt: string | null;
  failedInRow: number;
  createdAt: string;
  updatedAt: string;
}

export interface Delivery {
  id: string;
  eventId: string;
  type: string;
  userCouponId: string;
  status: 'PENDING' | 'DELIVERED' | 'FAILED';
  attemptCount: number;
  lastStatusCode: number | null;
  lastError: string | null;
  nextAttemptAt: string | null;
  createdAt: string;
  deliveredAt: string | null;
  attempts: { attemptedAt: string; statusCode: number | null; error: string | null; durationMs: number }[];
}
