import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { Discount, discountFor } from './discount.js';

describe('discountFor', () => {
  it.each([
    [{ type: 'AMOUNT', thresholdCents: 10000, amountCents: 1000 }, 9999, null],
    [{ type: 'AMOUNT', thresholdCents: 10000, amountCents: 1000 }, 10000, 1000],
    [{ type: 'AMOUNT', thresholdCents: 0, amountCents: 1000 }, 600, 600],
    [{ type: 'AMOUNT', thresholdCents: 0, amountCents: 1000 }, 0, 0],
    [{ type: 'PERCENT', thresholdCents: 5000, percentOff: 15, maxDiscountCents: null }, 4999, null],
    [{ type: 'PERCENT', thresholdCents: 5000, percentOff: 15, maxDiscountCents: null }, 10001, 1500],
    [{ type: 'PERCENT', thresholdCents: 0, percentOff: 15, maxDiscountCents: 1000 }, 10001, 1000],
    [{ type: 'PERCENT', thresholdCents: 0, percentOff: 100, maxDiscountCents: null }, 777, 777],
    [{ type: 'PERCENT', thresholdCents: 0, percentOff: 1, maxDiscountCents: null }, 99, 0],
    [{ type: 'PERCENT', thresholdCents: 0, percentOff: 33, maxDiscountCents: null }, 999_999_999_999, 329_999_999_999],
  ] as [Discount, number, number | null][])('%j on %d cents gives %p', (d, amount, expected) => {
    expect(discountFor(d, amount)).toBe(expected);
  });

  it('never exceeds the order, the amount or the cap, and is null exactly below the threshold', () => {
    const discount = fc.oneof(
      fc.record({ type: fc.constant('AMOUNT' as const), thresholdCents: fc.nat(1e6), amountCents: fc.integer({ min: 1, max: 1e6 }) }),
      fc.record({
        type: fc.constant('PERCENT' as const),
        thresholdCents: fc.nat(1e6),
        percentOff: fc.integer({ min: 1, max: 100 }),
        maxDiscountCents: fc.option(fc.integer({ min: 1, max: 1e6 })),
      }),
    );
    fc.assert(
      fc.property(discount, fc.nat(1e12), (d, amount) => {
        const off = discountFor(d, amount);
        if (amount < d.thresholdCents) return off === null;
        if (off === null || !Number.isInteger(off) || off < 0 || off > amount) return false;
        if (d.type === 'AMOUNT') return off === Math.min(d.amountCents, amount);
        return off <= (d.maxDiscountCents ?? Infinity) && off <= Math.floor((amount * d.percentOff) / 100);
      }),
    );
  });
});
