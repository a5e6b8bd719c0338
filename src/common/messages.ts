import i18next from 'i18next';
import Negotiator from 'negotiator';
import type { ErrorCode } from './errors.js';

/**
 * The error messages people read, by code, for the languages the service answers in besides
 * English. English messages stay the ones thrown (they name the coupon, the limit, the role); the
 * catalogues here say the same for the code, since a shopper's front end shows `message` as it is.
 * Typed by the code enum: a new code without its translation does not compile.
 */
const ZH_CN: Record<ErrorCode, string> = {
  VALIDATION_FAILED: '请求参数有误，请检查后重试',
  UNAUTHENTICATED: '请先登录',
  FORBIDDEN: '没有权限执行此操作',
  NOT_FOUND: '请求的地址不存在',
  COUPON_NOT_FOUND: '优惠券不存在',
  USER_COUPON_NOT_FOUND: '没有找到这张券',
  GRAB_NOT_FOUND: '没有找到这次领取的结果',
  RUN_NOT_FOUND: '没有找到这次对账',
  COMPENSATION_NOT_FOUND: '没有找到这条补偿建议',
  HOLD_NOT_FOUND: '没有找到这笔订单对这张券的锁定',
  WEBHOOK_NOT_FOUND: '没有找到这个 Webhook',
  WEBHOOK_DELIVERY_NOT_FOUND: '这个 Webhook 没有这次投递',
  ISSUANCE_JOB_NOT_FOUND: '没有找到这个批量发券任务',
  REQUEST_TIMEOUT: '请求超时，请重试',
  GRAB_NOT_STARTED: '活动还没开始，请稍后再来',
  GRAB_ENDED: '活动已结束',
  COUPON_PAUSED: '活动已暂停',
  SOLD_OUT: '已抢光',
  USER_LIMIT_REACHED: '您已领过这张券，已达每人限领数量',
  IDEMPOTENCY_IN_PROGRESS: '正在为您领取，请稍后查看结果',
  INSUFFICIENT_STOCK: '库存不足',
  ILLEGAL_TRANSITION: '这张券当前的状态不允许此操作',
  STATUS_CONFLICT: '这张券的状态刚刚发生了变化，请刷新后重试',
  COUPON_ALREADY_USED: '这张券已经使用过了',
  COUPON_EXPIRED: '这张券已过期',
  COUPON_VOID: '这张券已作废',
  COUPON_NOT_YET_VALID: '这张券还未到可用时间',
  REFUND_RETURN_DISABLED: '这张券退款后不退回',
  NOT_REDEEMED: '这张券没有在这笔订单上使用',
  RECONCILIATION_RUNNING: '对账正在进行中',
  COUPON_LOCKED: '这张券已被其他未支付订单锁定',
  HOLD_EXPIRED: '这张券的锁定已超时，请重新下单',
  HOLD_RELEASED: '这张券的锁定已取消',
  HOLD_ALREADY_CONFIRMED: '订单已支付，这张券已使用',
  ORDER_HAS_COUPON: '这笔订单已使用了优惠券，不能再叠加',
  ORDER_REFUNDED: '这笔订单已退款，不能再使用优惠券',
  ISSUANCE_JOB_FINISHED: '批量发券任务已经结束',
  ALREADY_REPLACED: '这张券已经补发过了',
  COMPENSATION_ALREADY_DECIDED: '这条补偿建议已经处理过了',
  PAYLOAD_TOO_LARGE: '请求内容过大',
  UNSUPPORTED_MEDIA_TYPE: '不支持的内容类型',
  HEADERS_TOO_LARGE: '请求头过大',
  IDEMPOTENCY_KEY_REUSED: '这个请求编号已用于其他请求',
  WEBHOOK_URL_NOT_ALLOWED: '不允许使用这个 Webhook 地址',
  HOLD_MISMATCH: '订单金额与锁定时不一致',
  ORDER_AMOUNT_MISMATCH: '订单金额与之前不一致',
  THRESHOLD_NOT_MET: '订单金额未达到使用门槛',
  RATE_LIMITED: '手慢了，再试试',
  INTERNAL: '服务出了点问题，请稍后重试',
  SERVICE_UNAVAILABLE: '系统繁忙，请稍后重试',
  OUTCOME_UNKNOWN: '暂时无法确认这次操作是否成功，请稍后查询结果后再重试',
};

export const CATALOGUES = { 'zh-CN': ZH_CN } as const;
export type Language = 'en' | keyof typeof CATALOGUES;

const i18n = i18next.createInstance();
// Resources are in memory, so init completes synchronously (initAsync: false).
void i18n.init({
  initAsync: false,
  resources: Object.fromEntries(Object.entries(CATALOGUES).map(([lng, messages]) => [lng, { translation: messages }])),
  lng: 'en',
  fallbackLng: false,
  interpolation: { escapeValue: false },
});

/** Every language of the catalogues, plus the bare language (zh-TW, zh-Hans and zh all read Simplified Chinese best). */
const OFFERED = ['en', ...Object.keys(CATALOGUES), ...Object.keys(CATALOGUES).map((l) => l.split('-')[0])];

/** The language an Accept-Language header (with its q-values) prefers among those offered; English when none. */
export function languageOf(acceptLanguage: string | undefined): Language {
  if (!acceptLanguage) return 'en';
  const [best] = new Negotiator({ headers: { 'accept-language': acceptLanguage } }).languages(OFFERED);
  if (best === undefined || best === 'en') return 'en';
  return (Object.keys(CATALOGUES) as Language[]).find((l) => l === best || l.split('-')[0] === best) ?? 'en';
}

/** The message for a code in a language; for English, the message thrown. */
export function messageFor(code: ErrorCode, language: Language, english: string): string {
  return language === 'en' ? english : i18n.t(code, { lng: language });
}
