import type { LogEntry } from '../ledger/state-log.js';

export const EVENT_TYPES = [
  'user_coupon.issued',
  'user_coupon.locked',
  'user_coupon.released',
  'user_coupon.used',
  'user_coupon.expired',
  'user_coupon.voided',
] as const;
export type EventType = (typeof EVENT_TYPES)[number];

/**
 * The event type of a transition. Statuses are compared as strings so that states added to the
 * table later (LOCKED) map without a change here; LOCKED -> UNUSED gives a coupon back: released.
 */
export function eventType(from: string | null, to: string): EventType | null {
  switch (to) {
    case 'UNUSED':
      return from === null ? 'user_coupon.issued' : 'user_coupon.released';
    case 'LOCKED':
      return 'user_coupon.locked';
    case 'USED':
      return 'user_coupon.used';
    case 'EXPIRED':
      return 'user_coupon.expired';
    case 'VOID':
      return 'user_coupon.voided';
    default:
      return null;
  }
}

export interface WebhookEvent {
  id: string;
  type: EventType;
  timestamp: string;
  data: {
    userCoupon: Record<string, unknown> | null;
    from: string | null;
    to: string;
    txId: string;
    reason: string | null;
  };
}

export const eventId = (logId: string) => `evt_${logId}`;

/** The event of one log row, or null for a status no event type names. Built once, stored, and sent byte for byte on every attempt. */
export function buildEvent(e: LogEntry): WebhookEvent | null {
  const type = eventType(e.from, e.to);
  if (type === null) return null;
  const c = e.coupon;
  return {
    id: eventId(e.id),
    type,
    timestamp: e.at.toISOString(),
    data: {
      userCoupon: c && {
        id: e.userCouponId,
        couponId: c.couponId,
        userId: c.userId,
        status: e.to,
        source: c.source,
        issuedAt: c.issuedAt.toISOString(),
        validFrom: c.validFrom.toISOString(),
        expiresAt: c.expiresAt.toISOString(),
        usedAt: e.to === 'USED' ? (c.usedAt ?? e.at).toISOString() : null,
        replacesUserCouponId: c.replacesUserCouponId,
      },
      from: e.from,
      to: e.to,
      txId: e.txId,
      reason: e.reason,
    },
  };
}
