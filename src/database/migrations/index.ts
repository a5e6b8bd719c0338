import { resumable } from '../resumable-migration.js';
import { InitialSchema1764460800000 } from './1764460800000-initial-schema.js';
import { CaseSensitiveKeys1764547200000 } from './1764547200000-case-sensitive-keys.js';
import { CheckoutHolds1764633600000 } from './1764633600000-checkout-holds.js';
import { TxMarker1764720000000 } from './1764720000000-tx-marker.js';
import { Webhooks1764806400000 } from './1764806400000-webhooks.js';
import { BulkIssuance1764892800000 } from './1764892800000-bulk-issuance.js';
import { ExactOrderNumbers1764979200000 } from './1764979200000-exact-order-numbers.js';
import { HandEditsTouchUserCoupons1765065600000 } from './1765065600000-hand-edits-touch-user-coupons.js';
import { BulkSkippedExpired1765152000000 } from './1765152000000-bulk-skipped-expired.js';
import { BulkListDigest1765238400000 } from './1765238400000-bulk-list-digest.js';
import { AdminRequestKeys1765324800000 } from './1765324800000-admin-request-keys.js';
import { WebhookFinalAttempt1765411200000 } from './1765411200000-webhook-final-attempt.js';
import { RefundNumbers1765497600000 } from './1765497600000-refund-numbers.js';
import { SkipReasonIndex1765584000000 } from './1765584000000-skip-reason-index.js';
import { OrderLockStripes1765670400000 } from './1765670400000-order-lock-stripes.js';
import { CouponCountsIndex1765756800000 } from './1765756800000-coupon-counts-index.js';
import { RefundCouponIndex1765843200000 } from './1765843200000-refund-coupon-index.js';
import { RunTotals1765929600000 } from './1765929600000-run-totals.js';
import { RefundFindingKeys1766016000000 } from './1766016000000-refund-finding-keys.js';
import { RefundOrderIndex1766102400000 } from './1766102400000-refund-order-index.js';
import { StateLogCoveringIndex1766188800000 } from './1766188800000-state-log-covering-index.js';

/** Every migration, in order, each resumable where it stopped (resumable-migration.ts). The app, the CLI (ormconfig.ts) and the tests all use this list. */
export const migrations = [
  InitialSchema1764460800000,
  CaseSensitiveKeys1764547200000,
  CheckoutHolds1764633600000,
  TxMarker1764720000000,
  Webhooks1764806400000,
  BulkIssuance1764892800000,
  ExactOrderNumbers1764979200000,
  HandEditsTouchUserCoupons1765065600000,
  BulkSkippedExpired1765152000000,
  BulkListDigest1765238400000,
  AdminRequestKeys1765324800000,
  WebhookFinalAttempt1765411200000,
  RefundNumbers1765497600000,
  SkipReasonIndex1765584000000,
  OrderLockStripes1765670400000,
  CouponCountsIndex1765756800000,
  RefundCouponIndex1765843200000,
  RunTotals1765929600000,
  RefundFindingKeys1766016000000,
  RefundOrderIndex1766102400000,
  StateLogCoveringIndex1766188800000,
].map(resumable);
