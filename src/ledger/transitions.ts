export const USER_COUPON_STATUSES = ['UNUSED', 'LOCKED', 'USED', 'EXPIRED', 'VOID'] as const;
export type UserCouponStatus = (typeof USER_COUPON_STATUSES)[number];

/**
 * The whole lifecycle of a user coupon. `null` is "not yet issued"; USED and VOID are final.
 * LOCKED is held for one unpaid order: confirmed (USED), released (UNUSED), or released after its
 * validity ended (EXPIRED). It cannot be voided while held: the order may still be paid.
 */
export const TRANSITIONS: Readonly<Record<UserCouponStatus | 'null', readonly UserCouponStatus[]>> = {
  null: ['UNUSED'],
  UNUSED: ['LOCKED', 'USED', 'EXPIRED', 'VOID'],
  LOCKED: ['USED', 'UNUSED', 'EXPIRED'],
  EXPIRED: ['VOID'],
  USED: [],
  VOID: [],
};

/** A status written by hand outside the table (a typo, say) has no legal moves: refused, not a crash. */
export function isLegal(from: UserCouponStatus | null, to: UserCouponStatus): boolean {
  return (TRANSITIONS as Partial<Record<string, readonly UserCouponStatus[]>>)[from ?? 'null']?.includes(to) === true;
}

export interface LogStep {
  from: UserCouponStatus | null;
  to: UserCouponStatus;
}

export interface Replay {
  /** Status reached by replaying the log from issuance, or null if the log is empty. */
  status: UserCouponStatus | null;
  /** Index of the last step that was legal and continued from the previous one (-1: none). */
  lastConsistentIndex: number;
  legal: boolean;
}

/** Replays a coupon's log from issuance; stops at the first step that is illegal or does not start where the previous one ended. */
export function replay(steps: readonly LogStep[]): Replay {
  let status: UserCouponStatus | null = null;
  for (let i = 0; i < steps.length; i++) {
    const s = steps[i];
    if (s.from !== status || !isLegal(s.from, s.to)) return { status, lastConsistentIndex: i - 1, legal: false };
    status = s.to;
  }
  return { status, lastConsistentIndex: steps.length - 1, legal: true };
}
