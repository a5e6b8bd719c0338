/*
 * What each route answers, in one table: the part of the contract decorators cannot infer.
 * The document builder (document.ts) applies it to what @nestjs/swagger generates from the
 * controllers and DTOs, and test/openapi.spec.ts fails when a route is served but not listed here.
 *
 * Adding a route (holds, webhooks, bulk, ...):
 *   1. Write the controller and its request DTOs as usual (@ApiProperty on every field, with
 *      `type: 'integer'`, `format: 'date-time'`, `pattern`, min/max as the validators check).
 *   2. Add the answer body schema to RESPONSE_SCHEMAS in schemas.ts if it is new.
 *   3. Add an entry here, keyed `METHOD /path/{param}` exactly as the OpenAPI path reads:
 *      - `auth`: 'public' (no token), 'user' (any valid token) or the roles of which one is needed;
 *      - `ok`: each success status with its schema name and the headers it sets;
 *      - `errors`: the codes of src/common/errors.ts the route itself can answer. The status of each
 *        comes from ERROR_STATUS; the codes every route of its kind can give are added for you (see
 *        commonErrors in document.ts: request timeout and header size, input validation, token, role,
 *        body size and media type, outage).
 *   4. `npm run openapi` regenerates docs/openapi.json and the typed client; commit both. The e2e
 *      suites then check every answer of the new route against the entry.
 */
import type { Role } from '../auth/principal.js';
import type { ErrorCode } from '../common/errors.js';
import type { HeaderName } from './schemas.js';

export interface SuccessAnswer {
  /**
   * A components/schemas name (RESPONSE_SCHEMAS, or a view class @nestjs/swagger registered) for a JSON body, 'text' for text/plain,
   * 'csv' for text/csv (UTF-8), 'none' for no body.
   */
  schema: string;
  description: string;
  headers?: HeaderName[];
  /** Headers present on every answer of this status (beyond x-request-id, which always is). */
  requiredHeaders?: HeaderName[];
}

export interface RouteContract {
  summary: string;
  description?: string;
  /** 'public': no token; 'user': any valid token; else the token needs one of these roles. */
  auth: 'public' | 'user' | readonly Role[];
  ok: Record<number, SuccessAnswer>;
  errors: readonly ErrorCode[];
  /** false for routes that never touch the database (no 503 OUTCOME_UNKNOWN; SERVICE_UNAVAILABLE still, while the instance shuts down). */
  usesDatabase?: boolean;
  /** Headers its error answers may carry besides the ones every error can (Retry-After, Content-Language). */
  errorHeaders?: HeaderName[];
  /** A request body that the route accepts, shown as the example in the document and the UI. */
  requestExample?: unknown;
  /** Request media types besides the JSON one the DTO describes (e.g. a text/csv upload). */
  otherRequestContent?: Record<string, { schema: Record<string, unknown>; example?: unknown }>;
}

const REPLAYED: HeaderName[] = ['Idempotent-Replayed'];
const GZIPPED: HeaderName[] = ['Content-Encoding', 'Vary'];
const PUBLIC_READ: HeaderName[] = [...GZIPPED, 'Cache-Control'];

/** REDEMPTIONS_BY_USERS=false (src/redemption/checks.ts), as the holds and redemptions say it. */
const ONLY_THE_ORDER_SERVICE =
  'With REDEMPTIONS_BY_USERS=false a user token is 403 FORBIDDEN here: only the order service (role service) puts coupons on orders.';

/** What a hold and a redemption both check before they put a coupon on an order (src/redemption/checks.ts, order.ts). */
const ORDER_CHECKS: readonly ErrorCode[] = [
  'FORBIDDEN',
  'USER_COUPON_NOT_FOUND',
  'COUPON_ALREADY_USED',
  'COUPON_EXPIRED',
  'COUPON_VOID',
  'COUPON_NOT_YET_VALID',
  'COUPON_LOCKED',
  'THRESHOLD_NOT_MET',
  'IDEMPOTENCY_KEY_REUSED',
  'ORDER_HAS_COUPON',
  'ORDER_REFUNDED',
  'ORDER_AMOUNT_MISMATCH',
  'STATUS_CONFLICT',
];

export const ROUTES: Record<string, RouteContract> = {
  'GET /coupons': {
    summary: 'The coupon centre: live coupons, soonest grab start first (served from memory)',
    auth: 'public',
    ok: { 200: { schema: 'CouponPage', description: 'One page', headers: PUBLIC_READ } },
    errors: [],
    errorHeaders: ['Cache-Control'],
  },
  'GET /coupons/{couponId}': {
    summary: 'A coupon template with its remaining stock',
    auth: 'public',
    ok: { 200: { schema: 'Coupon', description: 'The coupon', headers: PUBLIC_READ } },
    errors: ['COUPON_NOT_FOUND'],
    errorHeaders: ['Cache-Control'],
  },
  'POST /coupons/{couponId}/grab': {
    summary: 'Grab one coupon (idempotent by Idempotency-Key)',
    description:
      'Issues one user coupon from stock. A replay of a successful grab (same user, key and coupon) answers the same 201 body with ' +
      '`Idempotent-Replayed: true`; the same key for another coupon is 422; a duplicate in flight waits and replays, or gets 409 ' +
      'IDEMPOTENCY_IN_PROGRESS. A client whose grab timed out asks `GET /grabs/{idempotencyKey}`.',
    auth: 'user',
    ok: { 201: { schema: 'UserCoupon', description: 'The coupon issued to the caller under this key', headers: REPLAYED } },
    errors: [
      'COUPON_NOT_FOUND',
      'GRAB_NOT_STARTED',
      'GRAB_ENDED',
      'COUPON_PAUSED',
      'SOLD_OUT',
      'USER_LIMIT_REACHED',
      'IDEMPOTENCY_IN_PROGRESS',
      'IDEMPOTENCY_KEY_REUSED',
      'RATE_LIMITED',
    ],
  },
  'GET /grabs/{idempotencyKey}': {
    summary: 'The coupon a grab with this key issued to the caller',
    auth: 'user',
    ok: { 200: { schema: 'UserCoupon', description: 'The coupon that key issued' } },
    errors: ['GRAB_NOT_FOUND'],
  },
  'GET /me/coupons': {
    summary: "The caller's coupons, newest first",
    auth: 'user',
    ok: { 200: { schema: 'UserCouponPage', description: 'One page' } },
    errors: [],
  },
  'GET /me/coupons/usable': {
    summary: "The caller's coupons usable now on an order of orderAmountCents, with the discount each gives",
    description: 'A service names the user with `userId`; a user may leave it out or name themself.',
    auth: 'user',
    ok: { 200: { schema: 'UsableCoupons', description: 'Largest discount first, then soonest expiry' } },
    errors: ['FORBIDDEN'],
  },
  'GET /me/coupons/{userCouponId}': {
    summary: 'One of the caller’s coupons',
    auth: 'user',
    ok: { 200: { schema: 'UserCoupon', description: 'The coupon' } },
    errors: ['USER_COUPON_NOT_FOUND'],
  },
  'POST /redemptions': {
    summary: 'Use a coupon on an order (idempotent by orderNo and userCouponId)',
    description:
      'A user redeems their own coupon; the order service (role service) redeems for the `userId` it names. A repeat of the same ' +
      '(orderNo, userCouponId) answers 200 with the first body, `firstUse: false` and `Idempotent-Replayed: true`; a repeat with ' +
      'another orderAmountCents is 422 IDEMPOTENCY_KEY_REUSED. ' +
      ONLY_THE_ORDER_SERVICE,
    auth: 'user',
    ok: {
      201: { schema: 'Redemption', description: 'Used now (`firstUse: true`)' },
      200: { schema: 'Redemption', description: 'A repeat: the redemption made earlier (`firstUse: false`)', requiredHeaders: REPLAYED },
    },
    errors: [...ORDER_CHECKS, 'HOLD_EXPIRED', 'HOLD_RELEASED', 'HOLD_MISMATCH'],
    requestExample: { userCouponId: '1024', orderNo: 'ORD-20260101-0001', orderAmountCents: 12900 },
  },
  'POST /redemptions/holds': {
    summary: 'Hold a coupon for an unpaid order (idempotent by orderNo and userCouponId)',
    description:
      'Checks like a redemption, then locks the coupon (LOCKED) for ttlSeconds (default HOLD_TTL_SECONDS, 900). POST /redemptions ' +
      'with the same pair confirms it. A repeat answers the hold as it is now (200, `Idempotent-Replayed: true`); another ' +
      'orderAmountCents is 422; a coupon held by another order is 409 COUPON_LOCKED. ' +
      ONLY_THE_ORDER_SERVICE,
    auth: 'user',
    ok: {
      201: { schema: 'Hold', description: 'Held now' },
      200: { schema: 'Hold', description: 'A repeat: the hold as it is now', requiredHeaders: REPLAYED },
    },
    errors: ORDER_CHECKS,
    requestExample: { userCouponId: '1024', orderNo: 'ORD-20260101-0001', orderAmountCents: 12900, ttlSeconds: 900 },
  },
  'POST /redemptions/holds/release': {
    summary: 'Release the hold of an order (cancelled): the coupon is UNUSED again, or EXPIRED past its validity',
    description:
      'Repeats answer the same hold with `Idempotent-Replayed: true` once it was cancelled; a hold that timed out (TIMEOUT) or was closed by reconciliation (RECONCILIATION) is answered without it, whether or not the sweep stored the timeout. After a confirmation 409 HOLD_ALREADY_CONFIRMED. ' +
      ONLY_THE_ORDER_SERVICE,
    auth: 'user',
    ok: { 200: { schema: 'Hold', description: 'The released hold', headers: REPLAYED } },
    errors: ['FORBIDDEN', 'HOLD_NOT_FOUND', 'HOLD_ALREADY_CONFIRMED', 'STATUS_CONFLICT'],
    requestExample: { userCouponId: '1024', orderNo: 'ORD-20260101-0001' },
  },
  'POST /redemptions/refunds': {
    summary: 'Record a refund of a redeemed order (idempotent by refundNo)',
    description:
      'When the template has `returnOnRefund`, a replacement coupon (source REFUND_RETURN) is issued; the original stays USED. ' +
      "Once the template's fixed validity has ended the refund is recorded without one (`replacementUserCoupon: null`): it would be born EXPIRED. " +
      'Repeats of a refundNo, and another refundNo for an already refunded redemption, answer that refund with `Idempotent-Replayed: true`.',
    auth: ['service'],
    ok: { 201: { schema: 'Refund', description: 'The refund', headers: REPLAYED } },
    errors: ['USER_COUPON_NOT_FOUND', 'NOT_REDEEMED', 'REFUND_RETURN_DISABLED', 'IDEMPOTENCY_KEY_REUSED'],
    requestExample: { userCouponId: '1024', orderNo: 'ORD-20260101-0001', refundNo: 'RF-20260102-0001' },
  },
  'POST /admin/coupons': {
    summary: 'Create a coupon template and its stock',
    auth: ['admin'],
    ok: {
      201: {
        schema: 'Coupon',
        description: 'The new coupon (a repeat of the Idempotency-Key: that coupon as it is now)',
        headers: REPLAYED,
      },
    },
    errors: ['IDEMPOTENCY_KEY_REUSED'],
    requestExample: {
      name: 'Spend 100 save 10',
      totalStock: 5000,
      perUserLimit: 1,
      grabStartAt: '2026-01-01T00:00:00.000Z',
      grabEndAt: '2030-01-01T00:00:00.000Z',
      validity: { type: 'RELATIVE', days: 7 },
      discount: { thresholdCents: 10000, amountCents: 1000 },
      returnOnRefund: false,
    },
  },
  'GET /admin/coupons': {
    summary: 'Coupons, newest first, each with its counts by status',
    description:
      'With `q`, only those whose name holds it (any case; `%` and `_` are themselves) or whose id it is. One indexed count per coupon: ' +
      'for lists, not for polling (poll `/admin/coupons/{couponId}/series`).',
    auth: ['admin'],
    ok: { 200: { schema: 'AdminCouponPage', description: 'One page' } },
    errors: [],
  },
  'GET /admin/coupons/{couponId}/series': {
    summary: 'Live view for polling: remaining stock and grab outcomes per second',
    description: 'Remaining stock is one primary-key read; the outcomes are counted in the memory of the instance that answers.',
    auth: ['admin'],
    ok: { 200: { schema: 'CouponSeriesView', description: 'The coupon now and its last seconds' } },
    errors: ['COUPON_NOT_FOUND'],
  },
  'GET /admin/users/{userId}/coupons': {
    summary: "A user's coupons, as GET /me/coupons shows them to that user",
    description: 'An unknown user has an empty list.',
    auth: ['admin'],
    ok: { 200: { schema: 'UserCouponPage', description: 'One page, newest first' } },
    errors: [],
  },
  'GET /admin/user-coupons': {
    summary: "A user's coupons, the user named in the query: the page GET /admin/users/{userId}/coupons answers",
    description:
      'Takes every user id, `.` and `..` included: a browser resolves a path segment `.` or `..` (escaped or not) before sending, ' +
      'so GET /admin/users/../coupons would arrive as GET /admin/coupons. An unknown user has an empty list.',
    auth: ['admin'],
    ok: { 200: { schema: 'UserCouponPage', description: 'One page, newest first' } },
    errors: [],
  },
  'GET /admin/coupons/{couponId}': {
    summary: 'A coupon with the counts of its user coupons by status',
    auth: ['admin'],
    ok: { 200: { schema: 'AdminCoupon', description: 'The coupon and its counts' } },
    errors: ['COUPON_NOT_FOUND'],
  },
  'PATCH /admin/coupons/{couponId}': {
    summary: 'Pause or resume grabs, or change the rate limit',
    auth: ['admin'],
    ok: { 200: { schema: 'Coupon', description: 'The coupon as changed' } },
    errors: ['COUPON_NOT_FOUND'],
    requestExample: { status: 'PAUSED' },
  },
  'POST /admin/coupons/{couponId}/stock': {
    summary: 'Add or remove stock (changes initStock and remainingStock by delta)',
    auth: ['admin'],
    ok: {
      200: {
        schema: 'Coupon',
        description: 'The coupon with its new stock (a repeat of the Idempotency-Key: the coupon as it is now)',
        headers: REPLAYED,
      },
    },
    errors: ['COUPON_NOT_FOUND', 'INSUFFICIENT_STOCK', 'IDEMPOTENCY_KEY_REUSED'],
    requestExample: { delta: 500 },
  },
  'POST /admin/user-coupons/{userCouponId}/void': {
    summary: 'Void an UNUSED or EXPIRED user coupon (a coupon held for an order is 409 COUPON_LOCKED)',
    auth: ['admin'],
    ok: { 200: { schema: 'UserCoupon', description: 'The voided coupon' } },
    errors: ['USER_COUPON_NOT_FOUND', 'ILLEGAL_TRANSITION', 'STATUS_CONFLICT', 'COUPON_LOCKED'],
    requestExample: { reason: 'issued by mistake' },
  },
  'POST /admin/user-coupons/reissue': {
    summary: 'Issue a coupon to a user by hand (optionally idempotent by Idempotency-Key)',
    description:
      "409 COUPON_EXPIRED once the template's fixed validity has ended (the coupon would be born EXPIRED). A repeat of the " +
      'Idempotency-Key with another couponId, fromStock, replacesUserCouponId or reason is 422. A coupon is replaced once: ' +
      'naming one a reissue or a refund replaced already is 409 ALREADY_REPLACED (`details.replacedBy`).',
    auth: ['admin'],
    ok: { 201: { schema: 'UserCoupon', description: 'The reissued coupon (source REISSUE)', headers: REPLAYED } },
    errors: ['COUPON_NOT_FOUND', 'USER_COUPON_NOT_FOUND', 'COUPON_EXPIRED', 'SOLD_OUT', 'ALREADY_REPLACED', 'IDEMPOTENCY_KEY_REUSED'],
    requestExample: { couponId: '1', userId: 'alice', reason: 'support ticket 4711', fromStock: false },
  },
  'GET /admin/user-coupons/{userCouponId}/history': {
    summary: "A user coupon's state log, its replay and whether it is consistent",
    auth: ['admin'],
    ok: { 200: { schema: 'UserCouponHistory', description: 'The history' } },
    errors: ['USER_COUPON_NOT_FOUND'],
  },
  'POST /admin/reconciliation/runs': {
    summary: 'Start a reconciliation run in the background',
    description: 'The body is optional (mode FULL by default). One run at a time across all instances.',
    auth: ['admin'],
    ok: { 202: { schema: 'RunStarted', description: 'Started; follow it at GET /admin/reconciliation/runs/{runId}' } },
    errors: ['RECONCILIATION_RUNNING'],
    requestExample: { mode: 'FULL' },
  },
  'GET /admin/reconciliation/runs': {
    summary: 'Reconciliation runs, newest first',
    auth: ['admin'],
    ok: { 200: { schema: 'RunPage', description: 'One page' } },
    errors: [],
  },
  'GET /admin/reconciliation/runs/{runId}': {
    summary: 'One run, with its discrepancies counted by type',
    auth: ['admin'],
    ok: { 200: { schema: 'RunWithCounts', description: 'The run' } },
    errors: ['RUN_NOT_FOUND'],
  },
  'GET /admin/compensations': {
    summary: 'Proposed compensations with their discrepancy, oldest first',
    auth: ['admin'],
    ok: { 200: { schema: 'CompensationPage', description: 'One page' } },
    errors: [],
  },
  'POST /admin/compensations/{id}/approve': {
    summary: 'Perform the proposed action and mark it DONE, in one transaction',
    description: 'Re-checks that the data is still what the run saw (409 STATUS_CONFLICT when it changed).',
    auth: ['admin'],
    ok: { 200: { schema: 'Compensation', description: 'The decided compensation' } },
    // Not ILLEGAL_TRANSITION: a repair moves a coupon only along the legal path diagnosis.ts planned from the status approval finds again.
    errors: ['COMPENSATION_NOT_FOUND', 'COMPENSATION_ALREADY_DECIDED', 'STATUS_CONFLICT', 'INSUFFICIENT_STOCK'],
    requestExample: { reason: 'checked with the warehouse' },
  },
  'POST /admin/compensations/{id}/reject': {
    summary: 'Mark it REJECTED without changing any data',
    auth: ['admin'],
    ok: { 200: { schema: 'Compensation', description: 'The decided compensation' } },
    errors: ['COMPENSATION_NOT_FOUND', 'COMPENSATION_ALREADY_DECIDED'],
    requestExample: { reason: 'not a real gap' },
  },
  'POST /admin/coupons/{couponId}/issuances': {
    summary: 'Issue the coupon to a list of users (bulk issuance job)',
    description:
      'A JSON body (up to 10,000 `userIds`, 1 MiB: the 64 KiB of other routes does not apply) or a `text/csv` body of one user id per line (up to 1,000,000 lines, 64 MiB; blank lines and a ' +
      'header line are passed over: the first line with `Content-Type: text/csv; header=present` (RFC 4180), never with `header=absent`, ' +
      'and without the parameter when it is `user_id` or `userId`; `reason` and `fromStock` then go in the query). The list is stored as it streams in, then ' +
      'a job issues it in batches: 202 with the job id at once. A repeat of the Idempotency-Key answers the same job (`Idempotent-Replayed: true`). ' +
      'Each user gets at most one coupon from a job; invalid ids, repeats, users at perUserLimit (grabs and bulk together) and lines past the ' +
      'stock (fromStock) are skipped with their reason, as are the lines reached after the fixed validity ended (COUPON_EXPIRED); a coupon ' +
      'whose validity has already ended is refused (409 COUPON_EXPIRED). See docs/bulk-issuance.md.',
    auth: ['admin'],
    ok: { 202: { schema: 'JobCreatedView', description: 'The job, queued (or the one this key made before)', headers: REPLAYED } },
    errors: ['COUPON_NOT_FOUND', 'COUPON_EXPIRED', 'IDEMPOTENCY_KEY_REUSED', 'IDEMPOTENCY_IN_PROGRESS'],
    requestExample: { userIds: ['alice', 'bob'], reason: 'VIP November', fromStock: false },
    otherRequestContent: {
      'text/csv': { schema: { type: 'string', description: 'One user id per line' }, example: 'user_id\nalice\nbob\n' },
    },
  },
  'GET /admin/issuance-jobs': {
    summary: 'Bulk issuance jobs, newest first (optionally of one coupon)',
    auth: ['admin'],
    ok: { 200: { schema: 'IssuanceJobPage', description: 'One page; nextCursor is the id of the last job listed' } },
    errors: [],
  },
  'GET /admin/issuance-jobs/{jobId}': {
    summary: 'A bulk issuance job and its progress',
    auth: ['admin'],
    ok: { 200: { schema: 'IssuanceJobView', description: 'The job' } },
    errors: ['ISSUANCE_JOB_NOT_FOUND'],
  },
  'GET /admin/issuance-jobs/{jobId}/skipped': {
    summary: 'The lines a bulk issuance job did not issue, with their reason',
    auth: ['admin'],
    ok: { 200: { schema: 'SkippedPage', description: 'In line order; nextCursor is the last line number of the page' } },
    errors: ['ISSUANCE_JOB_NOT_FOUND'],
  },
  'GET /admin/issuance-jobs/{jobId}/skipped.csv': {
    summary: "A bulk issuance job's skipped lines as a CSV to upload again (all of them, or of one reason)",
    description:
      'A header line `user_id`, then the user id of each skipped line (`reason` given: of that reason only), in line order: the list a ' +
      'text/csv issuance takes as it is, so the SOLD_OUT lines of a sale go back up as a new job once stock is added. Streamed, however many ' +
      "lines; the text of an invalid line that a spreadsheet would take for a formula (`=`, `+`, `-`, `@`) starts with `'`. See docs/bulk-issuance.md.",
    auth: ['admin'],
    ok: { 200: { schema: 'csv', description: 'The file, `text/csv; charset=utf-8`', requiredHeaders: ['Content-Disposition'] } },
    errors: ['ISSUANCE_JOB_NOT_FOUND'],
  },
  'GET /admin/issuance-jobs/{jobId}/unprocessed.csv': {
    summary: 'The lines a bulk issuance job did not reach, as a CSV to upload again',
    description:
      'A header line `user_id`, then the user id of each line from where the job stopped (a cancelled or failed job; a running one as of ' +
      'the read; a completed one: the header alone), in line order, without repeats of an earlier line of the list (the job would have ' +
      'skipped those as DUPLICATE): the list a text/csv issuance takes as it is, so a cancelled job can be finished as a new one. ' +
      'Streamed, however many lines. See docs/bulk-issuance.md.',
    auth: ['admin'],
    ok: { 200: { schema: 'csv', description: 'The file, `text/csv; charset=utf-8`', requiredHeaders: ['Content-Disposition'] } },
    errors: ['ISSUANCE_JOB_NOT_FOUND'],
  },
  'POST /admin/issuance-jobs/{jobId}/cancel': {
    summary: 'Stop a bulk issuance job between batches',
    description: 'QUEUED or RUNNING -> CANCELLED (what was issued stays issued); cancelling a cancelled job answers it again.',
    auth: ['admin'],
    ok: { 200: { schema: 'IssuanceJobView', description: 'The job, CANCELLED' } },
    errors: ['ISSUANCE_JOB_NOT_FOUND', 'ISSUANCE_JOB_FINISHED'],
  },
  'POST /admin/webhooks': {
    summary: 'Register a webhook endpoint',
    description: 'The answer carries the signing secret, shown only here. See docs/webhooks.md.',
    auth: ['admin'],
    ok: { 201: { schema: 'CreatedWebhookView', description: 'The endpoint with its secret' } },
    errors: ['WEBHOOK_URL_NOT_ALLOWED'],
    requestExample: { url: 'https://hooks.example.org/coupons', events: ['user_coupon.used'], description: 'order analytics' },
  },
  'GET /admin/webhooks': {
    summary: 'Webhook endpoints',
    auth: ['admin'],
    ok: { 200: { schema: 'WebhookList', description: 'Every endpoint' } },
    errors: [],
  },
  'GET /admin/webhooks/{webhookId}': {
    summary: 'One webhook endpoint',
    auth: ['admin'],
    ok: { 200: { schema: 'WebhookView', description: 'The endpoint' } },
    errors: ['WEBHOOK_NOT_FOUND'],
  },
  'PATCH /admin/webhooks/{webhookId}': {
    summary: "Change a webhook endpoint's url, events or enabled",
    auth: ['admin'],
    ok: { 200: { schema: 'WebhookView', description: 'The endpoint as changed' } },
    errors: ['WEBHOOK_NOT_FOUND', 'WEBHOOK_URL_NOT_ALLOWED'],
    requestExample: { enabled: false },
  },
  'DELETE /admin/webhooks/{webhookId}': {
    summary: 'Delete a webhook endpoint and its deliveries',
    auth: ['admin'],
    ok: { 204: { schema: 'none', description: 'Deleted' } },
    errors: ['WEBHOOK_NOT_FOUND'],
  },
  'GET /admin/webhooks/{webhookId}/deliveries': {
    summary: "A webhook endpoint's deliveries with their attempts",
    auth: ['admin'],
    ok: { 200: { schema: 'DeliveryPage', description: 'One page' } },
    errors: ['WEBHOOK_NOT_FOUND'],
  },
  'POST /admin/webhooks/{webhookId}/redeliver': {
    summary: 'Send deliveries again: the named ones (FAILED or DELIVERED), or every FAILED one',
    description:
      'Each becomes PENDING and due now, for one more attempt (a failure makes it FAILED again); one already PENDING is left alone. The body may be left out. See docs/webhooks.md.',
    auth: ['admin'],
    ok: { 200: { schema: 'RedeliveryView', description: 'How many were made PENDING again' } },
    errors: ['WEBHOOK_NOT_FOUND', 'WEBHOOK_DELIVERY_NOT_FOUND'],
    requestExample: { deliveryIds: ['1024'] },
  },
  'GET /health': {
    summary: 'Whether the database answers',
    description:
      'A readiness check: 503 when the database does not answer (`details.checks.database`), and while the instance drains before it stops (SHUTDOWN_DRAIN_MS, `details.checks.stopping`), when every other route is still served, each answer with `Connection: close`.',
    auth: 'public',
    ok: { 200: { schema: 'Health', description: 'The database answers', headers: ['Cache-Control'] } },
    errors: [],
    errorHeaders: ['Cache-Control'],
  },
  'GET /metrics': {
    summary: 'Prometheus metrics (text exposition format)',
    description: 'Public unless the service sets METRICS_TOKEN; then it needs `Authorization: Bearer <METRICS_TOKEN>` (not a JWT).',
    auth: 'public',
    ok: { 200: { schema: 'text', description: 'The metrics' } },
    errors: ['UNAUTHENTICATED'],
    usesDatabase: false,
  },
};
