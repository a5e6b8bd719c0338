import { CATALOGUES } from '../common/messages.js';
import { PUBLIC_CURSOR } from '../coupon/coupon.dto.js';
import { ERROR_STATUS } from '../common/errors.js';
import { ID_PATTERN, IDEMPOTENCY_KEY_PATTERN, USER_ID_PATTERN } from '../common/validation.js';
import { COMPENSATION_STATUSES, NOTHING_DONE } from '../reconciliation/compensation.entity.js';
import { COMPENSATION_ACTIONS, DISCREPANCY_TYPES } from '../reconciliation/diagnosis.js';
import { EXPLANATION_KEYS } from '../reconciliation/explanations.js';
import { RUN_MODES } from '../reconciliation/reconciliation-run.entity.js';
import { USER_COUPON_STATUSES } from '../ledger/transitions.js';

/** A JSON Schema (2020-12, as OpenAPI 3.1 uses it). */
export type JsonSchema = Record<string, unknown>;

export const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });

/** Database ids: positive 64-bit integers, sent as strings so JavaScript clients keep every digit. */
const id = (description: string): JsonSchema => ({ type: 'string', pattern: ID_PATTERN.source, description, example: '1024' });
const nullableId = (description: string): JsonSchema => ({ type: ['string', 'null'], pattern: ID_PATTERN.source, description });
const userId: JsonSchema = { type: 'string', pattern: USER_ID_PATTERN.source, example: 'alice' };
const dateTime = (description?: string): JsonSchema => ({ type: 'string', format: 'date-time', ...(description ? { description } : {}) });
const nullableDateTime = (description: string): JsonSchema => ({ type: ['string', 'null'], format: 'date-time', description });
const int = (minimum: number, description?: string): JsonSchema => ({ type: 'integer', minimum, ...(description ? { description } : {}) });
const object = (properties: Record<string, JsonSchema>, description?: string): JsonSchema => ({
  type: 'object',
  ...(description ? { description } : {}),
  required: Object.keys(properties),
  properties,
  additionalProperties: false,
});
const page = (item: string, description: string): JsonSchema =>
  object(
    {
      items: { type: 'array', items: ref(item) },
      nextCursor: {
        type: ['string', 'null'],
        pattern: ID_PATTERN.source,
        description: 'Pass as `cursor` for the next page; null on the last page',
      },
    },
    description,
  );

export const USER_COUPON_SOURCES = ['GRAB', 'BULK', 'REISSUE', 'REFUND_RETURN'] as const;
const USER_COUPON_STATUS: JsonSchema = { type: 'string', enum: [...USER_COUPON_STATUSES] };

const COUPON_PROPERTIES: Record<string, JsonSchema> = {
  id: id('Coupon (template) id'),
  name: { type: 'string' },
  status: { type: 'string', enum: ['ACTIVE', 'PAUSED'] },
  perUserLimit: int(1),
  grabStartAt: dateTime(),
  grabEndAt: dateTime(),
  validity: ref('Validity'),
  discount: ref('Discount'),
  rateLimitPerSecond: { type: ['integer', 'null'], minimum: 1, description: 'null: the default RATE_LIMIT_PER_SECOND' },
  returnOnRefund: { type: 'boolean' },
  stackable: { type: 'boolean', description: 'May share an order with other coupons, when all of them are stackable' },
  initStock: int(0),
  remainingStock: {
    type: 'integer',
    description:
      'At least 0 (invariant 1). Only a hand edit of the stock row can break that; the answer then shows what is stored, for an operator to repair by adding stock (reconciliation reports STOCK_MISMATCH)',
  },
};

const RUN_PROPERTIES: Record<string, JsonSchema> = {
  id: id('Run id'),
  status: { type: 'string', enum: ['RUNNING', 'COMPLETED', 'FAILED'] },
  mode: { type: 'string', enum: [...RUN_MODES] },
  triggeredBy: { type: 'string', description: 'The admin user id, or "cron"' },
  startedAt: dateTime(),
  finishedAt: nullableDateTime('null while running'),
  checked: int(0, 'Rows audited: stock rows, user coupons, redemptions, refunds and orders'),
  discrepancies: int(0, 'Discrepancies this run recorded as new'),
  error: { type: ['string', 'null'] },
  totals: {
    ...object(
      {
        userCoupons: int(0, 'User coupons, in any status'),
        redemptions: int(0, 'USED redemptions (refunded ones included: a refund leaves its redemption USED)'),
        discountCents: int(0, 'The discount those redemptions gave'),
        refundedRedemptions: int(0, 'Of those, the refunded ones'),
        refundedDiscountCents: int(0, "The refunded ones' discount"),
      },
      'The ledger as a COMPLETED run read it, chunk by chunk (each chunk one snapshot); two nights apart, the difference is what the day added. null while running, for a FAILED run, and for runs before these figures',
    ),
    type: ['object', 'null'],
  },
};

/**
 * The answer bodies, written once as the schemas the document publishes. Every property is
 * required and no other is allowed: the answer-validation test holds the code to exactly this.
 */
export const RESPONSE_SCHEMAS: Record<string, JsonSchema> = {
  Error: {
    type: 'object',
    description: 'Every error answer. `code` is stable; `message` is for people; `details` names what was wrong.',
    required: ['code', 'message'],
    properties: {
      code: { type: 'string', enum: Object.keys(ERROR_STATUS) },
      message: { type: 'string' },
      details: { type: 'object', additionalProperties: true, description: 'e.g. `fields` for VALIDATION_FAILED' },
    },
    additionalProperties: false,
  },
  FixedValidity: object(
    { type: { type: 'string', const: 'FIXED' }, startAt: dateTime(), endAt: dateTime() },
    'Valid between two instants, whenever it was issued',
  ),
  RelativeValidity: object(
    { type: { type: 'string', const: 'RELATIVE' }, days: { type: 'integer', minimum: 1, maximum: 3650 } },
    'Valid for `days` days from issuance',
  ),
  Validity: {
    oneOf: [ref('FixedValidity'), ref('RelativeValidity')],
  },
  AmountDiscount: object(
    {
      type: { type: 'string', const: 'AMOUNT' },
      thresholdCents: int(0, 'Orders from this amount qualify'),
      amountCents: int(1, 'Taken off, at most the order amount'),
    },
    'Amount off an order of at least thresholdCents',
  ),
  PercentDiscount: object(
    {
      type: { type: 'string', const: 'PERCENT' },
      thresholdCents: int(0, 'Orders from this amount qualify'),
      percentOff: { type: 'integer', minimum: 1, maximum: 100 },
      maxDiscountCents: { type: ['integer', 'null'], minimum: 1, description: 'The most it takes off; null: no cap' },
    },
    'floor(amount * percentOff / 100) off an order of at least thresholdCents, at most maxDiscountCents and the order amount',
  ),
  Discount: {
    oneOf: [ref('AmountDiscount'), ref('PercentDiscount')],
  },
  Coupon: object(COUPON_PROPERTIES, 'A coupon template and its stock'),
  CouponCounts: object(
    {
      issued: int(0),
      issuedFromStock: int(
        0,
        'Those that took a unit of stock: initStock == remainingStock + issuedFromStock while no grab is in flight (refund returns and reissues not from stock are not)',
      ),
      unused: int(0),
      locked: int(0),
      used: int(0),
      expired: int(0),
      void: int(0),
    },
    'User coupons of this template by the status clients see (an UNUSED coupon past expiry counts as expired, a timed-out hold as released)',
  ),
  AdminCoupon: object({ ...COUPON_PROPERTIES, counts: ref('CouponCounts') }, 'A coupon template, its stock and its user coupons counted'),
  AdminCouponPage: page('AdminCoupon', 'Newest first'),
  WebhookList: { type: 'array', items: ref('WebhookView') },
  UserCoupon: object(
    {
      id: id('User coupon id'),
      couponId: id('The template it was issued from'),
      userId,
      status: {
        ...USER_COUPON_STATUS,
        description:
          'As clients see it: an UNUSED coupon past expiresAt is EXPIRED; LOCKED while held for an order, UNUSED again once the hold timed out',
      },
      source: { type: 'string', enum: [...USER_COUPON_SOURCES] },
      issuedAt: dateTime(),
      validFrom: dateTime(),
      expiresAt: dateTime(),
      usedAt: nullableDateTime('When it was redeemed'),
      replacesUserCouponId: nullableId(
        'The user coupon this one replaces: for REISSUE the one named in the reissue (if any), for REFUND_RETURN the one used on the refunded order; else null',
      ),
    },
    "One coupon in one user's hands",
  ),
  UserCouponPage: page('UserCoupon', 'Newest first'),
  CouponPage: object(
    {
      items: { type: 'array', items: ref('Coupon') },
      nextCursor: {
        type: ['string', 'null'],
        pattern: PUBLIC_CURSOR.source,
        description: 'Pass as `cursor` for the next page; null on the last page',
      },
    },
    'Live coupons (not paused, grab window not ended), soonest grab start first',
  ),
  UsableCoupon: object({ userCoupon: ref('UserCoupon'), discountCents: int(0, 'What it takes off this order') }),
  UsableCoupons: object({ items: { type: 'array', items: ref('UsableCoupon') } }, 'Largest discount first, then soonest expiry'),
  Hold: object(
    {
      holdId: id('Hold id'),
      userCouponId: id('The held user coupon'),
      orderNo: { type: 'string', minLength: 1, maxLength: 64 },
      userId,
      discountCents: int(0, 'The discount the confirmation will grant'),
      status: {
        type: 'string',
        enum: ['ACTIVE', 'CONFIRMED', 'RELEASED'],
        description: 'As clients see it: an ACTIVE hold past expiresAt is RELEASED (TIMEOUT)',
      },
      expiresAt: dateTime(),
      createdAt: dateTime(),
      releasedAt: nullableDateTime('When it was released (a timed-out hold: its expiresAt)'),
      releaseReason: { type: ['string', 'null'], enum: ['CANCELLED', 'TIMEOUT', 'RECONCILIATION', null] },
    },
    'A coupon held for one unpaid order',
  ),
  Transition: object({
    from: { type: ['string', 'null'], enum: [...USER_COUPON_STATUSES, null], description: 'null for the issuance' },
    to: USER_COUPON_STATUS,
    txId: { type: 'string', description: 'Idempotency key, order, refund, sweep run or admin action that made the move' },
    reason: { type: ['string', 'null'] },
    at: dateTime(),
  }),
  UserCouponHistory: object({
    userCoupon: ref('UserCoupon'),
    transitions: { type: 'array', items: ref('Transition') },
    replayedStatus: {
      type: ['string', 'null'],
      enum: [...USER_COUPON_STATUSES, null],
      description: 'Where replaying the log from issuance ends (or stops, at the first inconsistent step)',
    },
    firstInconsistentStep: {
      type: ['integer', 'null'],
      minimum: 0,
      description:
        'The index in `transitions` of the first step that is no move of the lifecycle, or does not start where the one before ended; null when every step is',
    },
    consistent: {
      type: 'boolean',
      description:
        'Every step legal and continuing from the previous one, ending at the stored status (a hold timed out but not yet swept is stored LOCKED while `userCoupon.status` shows it UNUSED)',
    },
  }),
  Redemption: object({
    redemptionId: id('Redemption id'),
    userCouponId: id('The coupon used'),
    orderNo: { type: 'string', minLength: 1, maxLength: 64 },
    userId,
    discountCents: int(0),
    status: { type: 'string', const: 'USED' },
    usedAt: dateTime(),
    firstUse: { type: 'boolean', description: 'true on the answer that used the coupon, false on repeats' },
  }),
  Refund: object({
    refundId: id('Refund id'),
    refundNo: { type: 'string', minLength: 1, maxLength: 64 },
    userCouponId: id('The coupon that was used on the order'),
    orderNo: { type: 'string', minLength: 1, maxLength: 64 },
    replacementUserCoupon: {
      oneOf: [ref('UserCoupon'), { type: 'null' }],
      description:
        "The coupon given back, when the template returns coupons; null once the template's fixed validity has ended, or when a reissue replaced the coupon already",
    },
    createdAt: dateTime(),
  }),
  RunStarted: object({ runId: id('Reconciliation run id') }),
  Run: object(RUN_PROPERTIES),
  RunWithCounts: object({
    ...RUN_PROPERTIES,
    byType: {
      type: 'object',
      description: 'Discrepancies this run recorded, by type (types it found none of are left out)',
      propertyNames: { enum: [...DISCREPANCY_TYPES] },
      additionalProperties: { type: 'integer', minimum: 1 },
    },
  }),
  RunPage: page('Run', 'Newest first'),
  Discrepancy: object({
    id: id('Discrepancy id'),
    runId: id('The run that found it'),
    type: { type: 'string', enum: [...DISCREPANCY_TYPES] },
    couponId: nullableId('The coupon template concerned'),
    userCouponId: nullableId('The user coupon concerned'),
    redemptionId: nullableId('The redemption concerned'),
    details: {
      type: 'object',
      description: 'What the audit saw; the other properties depend on the type',
      properties: {
        explanation: { type: 'string', description: 'What was found and what the proposal does, in English, for people' },
        explanationParts: {
          type: 'array',
          items: ref('ExplanationPart'),
          description:
            '`explanation` sentence by sentence, as a key and the values it names, for a client that says it in another language. ' +
            'Absent from discrepancies recorded before it was added',
        },
      },
      additionalProperties: true,
    },
    open: { type: 'boolean', description: 'false once its compensation was decided' },
    createdAt: dateTime(),
  }),
  ExplanationPart: object(
    {
      key: {
        type: 'string',
        enum: [...EXPLANATION_KEYS],
        description: 'Names the sentence. A key keeps its meaning; new ones may be added: show `explanation` for one you do not know',
      },
      params: {
        type: 'object',
        additionalProperties: { type: ['string', 'number'] },
        description: 'The values the sentence names (counts, order numbers, statuses, ids), by name',
      },
    },
    "One sentence of a discrepancy's explanation",
  ),
  Compensation: object({
    id: id('Compensation id'),
    status: { type: 'string', enum: [...COMPENSATION_STATUSES] },
    action: { type: 'string', enum: [...COMPENSATION_ACTIONS] },
    params: { type: 'object', additionalProperties: true, description: 'What the action will do, and what it expects to find' },
    decidedBy: { type: ['string', 'null'] },
    decisionReason: { type: ['string', 'null'] },
    decidedAt: nullableDateTime('null while PENDING'),
    result: {
      type: ['object', 'null'],
      required: ['done'],
      properties: {
        done: {
          type: 'string',
          enum: [...COMPENSATION_ACTIONS.filter((a) => a !== 'MANUAL_REVIEW'), ...Object.values(NOTHING_DONE)],
          description: 'The action performed, or a sentence for a decision that changed no data (a rejection, an approved MANUAL_REVIEW)',
        },
      },
      additionalProperties: true,
      description: 'What the decision did: `done`, and what the action wrote; null while PENDING',
    },
    createdAt: dateTime(),
    discrepancy: ref('Discrepancy'),
  }),
  CompensationPage: page('Compensation', 'Oldest first'),
  Health: {
    type: 'object',
    description: "@nestjs/terminus's health answer",
    required: ['status', 'info', 'error', 'details'],
    properties: {
      status: { type: 'string', const: 'ok' },
      info: { type: 'object', additionalProperties: true },
      error: { type: 'object', additionalProperties: true },
      details: { type: 'object', additionalProperties: true },
    },
    additionalProperties: false,
  },
};

/** Headers, referenced by the responses that set them. */
export const HEADERS = {
  'x-request-id': {
    description: "The request's id: the client's `X-Request-Id` when it is 1-128 of [A-Za-z0-9._:-], else a generated UUID",
    required: true,
    schema: { type: 'string', pattern: '^[A-Za-z0-9._:-]{1,128}$' },
  },
  'Idempotent-Replayed': {
    description: '`true` when this answer repeats the first answer to the same idempotent request; absent on the first',
    schema: { type: 'string', const: 'true' },
  },
  'Retry-After': {
    description: 'Seconds to wait before retrying',
    schema: { type: 'string', pattern: '^[0-9]+$' },
  },
  'Content-Encoding': {
    description: "`gzip` when the request's Accept-Encoding takes gzip and the JSON is 1 KiB or more; absent otherwise",
    schema: { type: 'string', const: 'gzip' },
  },
  Vary: {
    description:
      "`Accept-Encoding` (after `Origin` when CORS_ORIGINS is set): the answer is gzip'd or not by it, so a shared cache keeps both forms apart",
    required: true,
    schema: { type: 'string', pattern: '(^|, )Accept-Encoding$' },
  },
  'Cache-Control': {
    description:
      '`no-cache, no-store, must-revalidate` on a health answer (200 or 503), which no cache may keep; `no-cache` on the public ' +
      "coupon page and list (and their errors), which a cache (a CDN's too) may keep only if it asks again before each use: their stock changes by the second",
    schema: { type: 'string', enum: ['no-cache, no-store, must-revalidate', 'no-cache'] },
  },
  'Content-Disposition': {
    description: 'A download: `attachment; filename="job-<jobId>-skipped[-<reason>].csv"` or `"job-<jobId>-unprocessed.csv"`',
    schema: { type: 'string', pattern: '^attachment; filename="job-[0-9]+-(skipped(-[A-Z_]+)?|unprocessed)\\.csv"$' },
  },
  'Content-Language': {
    description:
      "The language of `message` when it is not English: the request's Accept-Language chose it (zh-CN, zh, zh-TW all give zh-CN)",
    schema: { type: 'string', enum: Object.keys(CATALOGUES) },
  },
} as const;
export type HeaderName = keyof typeof HEADERS;

/** Idempotency-Key as a request header or path segment. */
export const IDEMPOTENCY_KEY_SCHEMA: JsonSchema = { type: 'string', pattern: IDEMPOTENCY_KEY_PATTERN.source, example: 'checkout-7f3a' };
