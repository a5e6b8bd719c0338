import fc from 'fast-check';
import { diagnoseStock, diagnoseUserCoupon, legalPath, LogEntry, UserCouponFacts } from '../src/reconciliation/diagnosis.js';
import { isLegal, USER_COUPON_STATUSES, UserCouponStatus } from '../src/ledger/transitions.js';

const T0 = new Date('2026-01-01T00:00:00Z');
let nextLogId = 1;
const log = (...steps: [UserCouponStatus | null, UserCouponStatus, string?][]): LogEntry[] =>
  steps.map(([from, to, txId]) => ({ id: String(nextLogId++), from, to, txId: txId ?? 'k', reason: null, createdAt: T0 }));
const facts = (status: UserCouponStatus, entries: LogEntry[], orders: string[] = []): UserCouponFacts => ({
  userCouponId: '7',
  couponId: '3',
  userId: 'alice',
  status,
  usedAt: status === 'USED' ? T0 : null,
  discountCents: 1000,
  log: entries,
  usedRedemptions: orders.map((orderNo, i) => ({ id: String(100 + i), orderNo })),
});
const ops = (f: UserCouponFacts) => diagnoseUserCoupon(f)?.params.steps.map((s) => s.op);

/** Applies a repair plan to the facts in memory, as the compensation does to the tables. */
function applyPlan(f: UserCouponFacts): UserCouponFacts {
  const d = diagnoseUserCoupon(f);
  if (!d) return f;
  let { status, log: entries, usedRedemptions } = f;
  for (const s of d.params.steps) {
    if (s.op === 'REMOVE_LOG') entries = entries.filter((l) => !s.logIds.includes(l.id));
    if (s.op === 'APPEND_LOG')
      entries = [
        ...entries,
        ...log(...s.rows.map((r): [UserCouponStatus | null, UserCouponStatus, string] => [r.from, r.to, r.txId ?? 'compensation:1'])),
      ];
    if (s.op === 'SET_STATUS') {
      expect(status).toBe(s.from);
      status = s.to;
    }
    if (s.op === 'TRANSIT') {
      expect([status, isLegal(s.from, s.to)]).toEqual([s.from, true]);
      status = s.to;
      entries = [...entries, ...log([s.from, s.to, s.txId ?? 'compensation:1'])];
    }
    if (s.op === 'RECREATE_REDEMPTION') usedRedemptions = [...usedRedemptions, { id: '999', orderNo: s.orderNo }];
  }
  return { ...f, status, log: entries, usedRedemptions };
}

describe('reconciliation diagnosis', () => {
  it('finds nothing wrong with consistent coupons', () => {
    expect(diagnoseUserCoupon(facts('UNUSED', log([null, 'UNUSED'])))).toBeNull();
    expect(diagnoseUserCoupon(facts('USED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:A']), ['A']))).toBeNull();
    expect(diagnoseUserCoupon(facts('VOID', log([null, 'UNUSED'], ['UNUSED', 'EXPIRED'], ['EXPIRED', 'VOID'])))).toBeNull();
  });

  it('chooses the repair from what the log shows', () => {
    // status forced to USED, log says UNUSED, no redemption: back to UNUSED
    expect(diagnoseUserCoupon(facts('USED', log([null, 'UNUSED'])))?.params.steps).toEqual([
      { op: 'SET_STATUS', from: 'USED', to: 'UNUSED' },
    ]);
    // redemption row deleted, the log records the use by an order: recreate it from the log
    expect(diagnoseUserCoupon(facts('USED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:A-1'])))?.params.steps).toEqual([
      { op: 'RECREATE_REDEMPTION', orderNo: 'A-1', userId: 'alice', discountCents: 1000, usedAt: T0.toISOString() },
    ]);
    // a use logged under something that is not an order: not evidence of an order, back to UNUSED
    expect(ops(facts('USED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'admin'])))).toEqual(['REMOVE_LOG', 'SET_STATUS']);
    // redemption exists, row and log both say UNUSED: the state machine makes the missing move
    expect(diagnoseUserCoupon(facts('UNUSED', log([null, 'UNUSED']), ['B']))?.params.steps).toEqual([
      { op: 'TRANSIT', from: 'UNUSED', to: 'USED', txId: 'order:B' },
    ]);
    // redemption exists, log says USED, row reverted: the row follows the log
    expect(ops(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:B']), ['B']))).toEqual(['SET_STATUS']);
    // voided without a log row: the missing row is written
    expect(diagnoseUserCoupon(facts('VOID', log([null, 'UNUSED'])))?.params.steps).toEqual([
      { op: 'APPEND_LOG', rows: [{ from: 'UNUSED', to: 'VOID', txId: null, reason: null, createdAt: null }] },
    ]);
    // the log says used but not by an order, no redemption, row UNUSED: the stray log row goes
    expect(ops(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'k'])))).toEqual(['REMOVE_LOG']);
    // the log says used by an order, row UNUSED, no redemption: the use stands and the redemption comes back
    expect(ops(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:F'])))).toEqual(['SET_STATUS', 'RECREATE_REDEMPTION']);
    // a complete legal log the row cannot follow from: the row goes back to the log's status
    expect(diagnoseUserCoupon(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'VOID'])))?.params.steps).toEqual([
      { op: 'SET_STATUS', from: 'UNUSED', to: 'VOID' },
    ]);
  });

  it('names the break point and keeps the tx id of a row it re-orders', () => {
    const entries = log(['UNUSED', 'USED', 'order:C']);
    const d = diagnoseUserCoupon(facts('USED', entries, ['C']))!;
    expect(d.type).toBe('LOG_MISMATCH');
    expect(d.details).toMatchObject({ lastConsistentLogId: null, firstInconsistentLogId: entries[0].id, replayLegal: false });
    expect(d.params.steps).toEqual([
      { op: 'REMOVE_LOG', logIds: [entries[0].id] },
      {
        op: 'APPEND_LOG',
        rows: [
          { from: null, to: 'UNUSED', txId: null, reason: null, createdAt: null },
          { from: 'UNUSED', to: 'USED', txId: 'order:C', reason: null, createdAt: T0.toISOString() },
        ],
      },
    ]);
    const altered = log([null, 'UNUSED'], ['UNUSED', 'VOID']);
    expect(diagnoseUserCoupon(facts('USED', altered, ['D']))!.details).toMatchObject({
      lastConsistentLogId: altered[0].id,
      firstInconsistentLogId: altered[1].id,
      targetStatus: 'USED',
    });
  });

  it('classifies by what disagrees', () => {
    expect(diagnoseUserCoupon(facts('USED', log([null, 'UNUSED'])))?.type).toBe('USED_WITHOUT_REDEMPTION');
    expect(diagnoseUserCoupon(facts('EXPIRED', log([null, 'UNUSED'], ['UNUSED', 'EXPIRED']), ['E']))?.type).toBe('REDEMPTION_WITHOUT_USED');
    expect(diagnoseUserCoupon(facts('UNUSED', []))?.type).toBe('LOG_MISMATCH');
  });

  it('every plan, applied, leaves a coupon that nothing is wrong with (random corruptions)', () => {
    const status = fc.constantFrom(...USER_COUPON_STATUSES);
    const step = fc.tuple(fc.option(status, { nil: null }), status, fc.constantFrom('k', 'order:X', 'admin:void'));
    fc.assert(
      fc.property(status, fc.array(step, { maxLength: 5 }), fc.array(fc.constantFrom('X', 'Y'), { maxLength: 1 }), (s, steps, orders) => {
        const fixed = applyPlan(facts(s, log(...steps), orders));
        expect(diagnoseUserCoupon(fixed)).toBeNull();
      }),
      { numRuns: 5000 },
    );
  });

  it('legalPath walks the transition table', () => {
    expect(legalPath(null, 'VOID')).toEqual([
      [null, 'UNUSED'],
      ['UNUSED', 'VOID'],
    ]);
    expect(legalPath('EXPIRED', 'EXPIRED')).toEqual([]);
    expect(legalPath('USED', 'UNUSED')).toBeNull();
  });

  it('stock: the sign of the difference picks the action', () => {
    expect(diagnoseStock({ couponId: '1', initStock: 10, stock: 5, issuedFromStock: 5 })).toBeNull();
    expect(diagnoseStock({ couponId: '1', initStock: 10, stock: 3, issuedFromStock: 5 })).toMatchObject({
      action: 'RESTORE_STOCK',
      params: { difference: 2, count: 2 },
    });
    expect(diagnoseStock({ couponId: '1', initStock: 10, stock: 6, issuedFromStock: 5 })).toMatchObject({
      action: 'REMOVE_STOCK',
      params: { difference: -1, count: 1 },
    });
    expect(diagnoseStock({ couponId: '1', initStock: 10, stock: -1, issuedFromStock: 11 })).toMatchObject({
      action: 'MANUAL_REVIEW',
      params: { difference: 0 },
    });
  });
});
