import { randomUUID } from 'node:crypto';

/**
 * The state log's tx_id says what made a move. Every writer builds it here and every reader
 * (reconciliation's diagnosis) parses it here, so a prefix cannot change on one side only.
 */
export const TxIds = {
  /** A grab, by its Idempotency-Key. */
  grab: (key: string) => `grab:${key}`,
  /** A redemption on an order. Reconciliation trusts it as evidence of a use. */
  order: (orderNo: string) => `order:${orderNo}`,
  /** A checkout hold's moves (LOCKED and its release); its confirmation is an `order` use. */
  hold: (orderNo: string) => `hold:${orderNo}`,
  /** One run of the hold sweep. */
  holdSweep: () => `hold-sweep:${randomUUID()}`,
  /** The coupon a refund returned. */
  refund: (refundNo: string) => `refund:${refundNo}`,
  /** An operator's action: who did it, and a unique id to find the one request. */
  admin: (adminId: string, action: string) => `admin:${adminId}:${action}:${randomUUID()}`,
  /** One run of the expiry sweep. */
  expirySweep: () => `expiry-sweep:${randomUUID()}`,
  /** A coupon a bulk issuance job issued. */
  bulk: (jobId: string) => `bulk:${jobId}`,
  /** An approved reconciliation compensation. */
  compensation: (compensationId: string) => `compensation:${compensationId}`,
};

export type TxRef =
  | { kind: 'grab'; key: string }
  | { kind: 'order'; orderNo: string }
  | { kind: 'hold'; orderNo: string }
  | { kind: 'hold-sweep'; run: string }
  | { kind: 'refund'; refundNo: string }
  | { kind: 'admin'; adminId: string; action: string }
  | { kind: 'expiry-sweep'; run: string }
  | { kind: 'compensation'; compensationId: string }
  | { kind: 'bulk'; jobId: string };

// Order numbers are 1-64 code points (an emoji is one); a longer tail is not a redemption's tx id.
const ORDER = /^order:(.{1,64})$/u;
// Admin ids may contain ':', so the action and the request id are read from the right.
const ADMIN = /^admin:(.+):([^:]+):([^:]+)$/;

/** What a tx_id names, or null for anything no writer builds (old or hand-written rows). */
export function parseTxId(txId: string): TxRef | null {
  const order = ORDER.exec(txId);
  if (order) return { kind: 'order', orderNo: order[1] };
  const admin = ADMIN.exec(txId);
  if (admin) return { kind: 'admin', adminId: admin[1], action: admin[2] };
  const colon = txId.indexOf(':');
  const rest = txId.slice(colon + 1);
  if (colon < 0 || rest === '') return null;
  switch (txId.slice(0, colon)) {
    case 'grab':
      return { kind: 'grab', key: rest };
    case 'hold':
      return { kind: 'hold', orderNo: rest };
    case 'hold-sweep':
      return { kind: 'hold-sweep', run: rest };
    case 'refund':
      return { kind: 'refund', refundNo: rest };
    case 'expiry-sweep':
      return { kind: 'expiry-sweep', run: rest };
    case 'compensation':
      return { kind: 'compensation', compensationId: rest };
    case 'bulk':
      return { kind: 'bulk', jobId: rest };
    default:
      return null;
  }
}
