// Free of jest, so the benchmark shares it with the tests.

const HOUR = 3600_000;

export interface CouponInput {
  name?: string;
  totalStock?: number;
  perUserLimit?: number;
  grabStartAt?: string;
  grabEndAt?: string;
  validity?: { type: 'FIXED'; startAt: string; endAt: string } | { type: 'RELATIVE'; days: number };
  discount?:
    | { type?: 'AMOUNT'; thresholdCents: number; amountCents: number }
    | { type: 'PERCENT'; thresholdCents: number; percentOff: number; maxDiscountCents?: number };
  rateLimitPerSecond?: number;
  returnOnRefund?: boolean;
  stackable?: boolean;
}

/** A creation body for a coupon that is grabbable now, with overrides. */
export function couponBody(overrides: CouponInput = {}): Required<Omit<CouponInput, 'rateLimitPerSecond' | 'stackable'>> & CouponInput {
  const now = Date.now();
  return {
    name: 'Spend 100 save 10',
    totalStock: 100,
    perUserLimit: 1,
    grabStartAt: new Date(now - HOUR).toISOString(),
    grabEndAt: new Date(now + HOUR).toISOString(),
    validity: { type: 'RELATIVE', days: 7 },
    discount: { thresholdCents: 10000, amountCents: 1000 },
    returnOnRefund: false,
    ...overrides,
  };
}
