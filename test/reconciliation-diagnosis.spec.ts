import fc from 'fast-check';
import {
  ActiveHold,
  diagnoseMissingStock,
  diagnoseStock,
  diagnoseUserCoupon,
  legalPath,
  LogEntry,
  OtherRedemption,
  RepairParams,
  UserCouponFacts,
} from '../src/reconciliation/diagnosis.js';
import { isLegal, USER_COUPON_STATUSES, UserCouponStatus } from '../src/ledger/transitions.js';

const T0 = new Date('2026-01-01T00:00:00Z');
const HOLD_EXPIRY = new Date('2026-01-01T00:15:00Z');
let nextLogId = 1;
const log = (...steps: [UserCouponStatus | null, UserCouponStatus, string?][]): LogEntry[] =>
  steps.map(([from, to, txId]) => ({ id: String(nextLogId++), from, to, txId: txId ?? 'k', reason: null, createdAt: T0 }));
const facts = (
  status: UserCouponStatus,
  entries: LogEntry[],
  orders: string[] = [],
  more: { activeHolds?: ActiveHold[]; otherRedemptions?: OtherRedemption[]; expired?: boolean } = {},
): UserCouponFacts => ({
  userCouponId: '7',
  couponId: '3',
  userId: 'alice',
  status,
  usedAt: status === 'USED' ? T0 : null,
  // An EXPIRED coupon is past its expiry unless a case says otherwise.
  expired: more.expired ?? status === 'EXPIRED',
  log: entries,
  usedRedemptions: orders.map((orderNo, i) => ({ id: String(100 + i), orderNo })),
  otherRedemptions: more.otherRedemptions ?? [],
  activeHolds: more.activeHolds ?? [],
});
/** The repair a finding proposes (the test fails on any other kind of proposal). */
const plan = (f: UserCouponFacts): RepairParams | undefined => {
  const d = diagnoseUserCoupon(f);
  if (d && d.action !== 'MARK_CONSISTENT') throw new Error(`not a repair: ${d.action}`);
  return d?.params;
};
const ops = (f: UserCouponFacts) => plan(f)?.steps.map((s) => s.op);
/** A status written by hand that the lifecycle does not have. */
const BOGUS = 'void' as UserCouponStatus;

/** Applies a repair plan to the facts in memory, as the compensation does to the tables. */
function applyPlan(f: UserCouponFacts): UserCouponFacts {
  const p = plan(f);
  if (!p) return f;
  let { status, log: entries, usedRedemptions, otherRedemptions, activeHolds } = f;
  for (const s of p.steps) {
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
    if (s.op === 'RESTORE_REDEMPTION') {
      const restored = otherRedemptions.find((x) => x.id === s.redemptionId && x.status === s.from)!;
      otherRedemptions = otherRedemptions.filter((x) => x !== restored);
      usedRedemptions = [...usedRedemptions, { id: restored.id, orderNo: restored.orderNo }];
    }
    if (s.op === 'CLOSE_HOLDS') activeHolds = activeHolds.filter((h) => !s.holds.some((c) => c.holdId === h.id));
  }
  return { ...f, status, log: entries, usedRedemptions, otherRedemptions, activeHolds };
}

describe('reconciliation diagnosis', () => {
  it('finds nothing wrong with consistent coupons', () => {
    expect(diagnoseUserCoupon(facts('UNUSED', log([null, 'UNUSED'])))).toBeNull();
    expect(diagnoseUserCoupon(facts('USED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:A']), ['A']))).toBeNull();
    expect(diagnoseUserCoupon(facts('VOID', log([null, 'UNUSED'], ['UNUSED', 'EXPIRED'], ['EXPIRED', 'VOID'])))).toBeNull();
  });

  it('chooses the repair from what the log shows', () => {
    // status forced to USED, log says UNUSED, no redemption: back to UNUSED
    expect(plan(facts('USED', log([null, 'UNUSED'])))?.steps).toEqual([{ op: 'SET_STATUS', from: 'USED', to: 'UNUSED' }]);
    // redemption row deleted, the log records the use by an order: recreate it from the log
    expect(plan(facts('USED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:A-1'])))?.steps).toEqual([
      { op: 'RECREATE_REDEMPTION', orderNo: 'A-1', userId: 'alice', usedAt: T0.toISOString() },
    ]);
    // a use logged under something that is not an order: not evidence of an order, back to UNUSED
    expect(ops(facts('USED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'admin'])))).toEqual(['REMOVE_LOG', 'SET_STATUS']);
    // redemption exists, row and log both say UNUSED: the state machine makes the missing move
    expect(plan(facts('UNUSED', log([null, 'UNUSED']), ['B']))?.steps).toEqual([
      { op: 'TRANSIT', from: 'UNUSED', to: 'USED', txId: 'order:B' },
    ]);
    // redemption exists, log says USED, row reverted: the row follows the log
    expect(ops(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:B']), ['B']))).toEqual(['SET_STATUS']);
    // voided without a log row: the missing row is written
    expect(plan(facts('VOID', log([null, 'UNUSED'])))?.steps).toEqual([
      { op: 'APPEND_LOG', rows: [{ from: 'UNUSED', to: 'VOID', txId: null, reason: null, createdAt: null }] },
    ]);
    // expired without a log row: the missing row is written; expired by hand before its time: back to where the log left it
    expect(ops(facts('EXPIRED', log([null, 'UNUSED'])))).toEqual(['APPEND_LOG']);
    expect(plan(facts('EXPIRED', log([null, 'UNUSED']), [], { expired: false }))?.steps).toEqual([
      { op: 'SET_STATUS', from: 'EXPIRED', to: 'UNUSED' },
    ]);
    // the same with a log broken in the middle: still not expired, the status follows the log's legal part
    expect(plan(facts('EXPIRED', log([null, 'UNUSED'], ['LOCKED', 'UNUSED']), [], { expired: false }))?.steps.at(-1)).toEqual({
      op: 'SET_STATUS',
      from: 'EXPIRED',
      to: 'UNUSED',
    });
    // a live hold and a log ending LOCKED, even a broken one (a release's row lost): the status goes back to LOCKED
    const hold = { activeHolds: [{ id: '9', orderNo: 'O2', expiresAt: HOLD_EXPIRY }] };
    for (const entries of [
      log([null, 'UNUSED'], ['UNUSED', 'LOCKED']),
      log([null, 'UNUSED'], ['UNUSED', 'LOCKED'], ['UNUSED', 'LOCKED']),
    ]) {
      const d = diagnoseUserCoupon(facts('UNUSED', entries, [], hold));
      expect([d?.type, d && 'targetStatus' in d.details ? d.details.targetStatus : null]).toEqual(['LOG_MISMATCH', 'LOCKED']);
    }
    // the log says used but not by an order, no redemption, row UNUSED: the stray log row goes
    expect(ops(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'k'])))).toEqual(['REMOVE_LOG']);
    // the log says used by an order, row UNUSED, no redemption: the use stands and the redemption comes back
    expect(ops(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:F'])))).toEqual(['SET_STATUS', 'RECREATE_REDEMPTION']);
    // a complete legal log the row cannot follow from: the row goes back to the log's status
    expect(plan(facts('UNUSED', log([null, 'UNUSED'], ['UNUSED', 'VOID'])))?.steps).toEqual([
      { op: 'SET_STATUS', from: 'UNUSED', to: 'VOID' },
    ]);
  });

  it('names the break point and keeps the tx id of a row it re-orders', () => {
    const entries = log(['UNUSED', 'USED', 'order:C']);
    const d = diagnoseUserCoupon(facts('USED', entries, ['C']))!;
    if (d.action !== 'MARK_CONSISTENT') throw new Error(d.action);
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

  it('every plan, applied, leaves a coupon that nothing is wrong with, and no ACTIVE hold on a coupon it moved off LOCKED (random corruptions)', () => {
    const status = fc.constantFrom(...USER_COUPON_STATUSES, BOGUS);
    const step = fc.tuple(fc.option(status, { nil: null }), status, fc.constantFrom('k', 'order:X', 'admin:void'));
    const order = fc.constantFrom('X', 'Y');
    fc.assert(
      fc.property(
        status,
        fc.array(step, { maxLength: 5 }),
        fc.array(order, { maxLength: 1 }),
        fc.array(order, { maxLength: 1 }),
        fc.array(order, { maxLength: 2 }),
        (s, steps, orders, others, holds) => {
          const before = facts(s, log(...steps), orders, {
            // One redemption row per (order, coupon): a row of another status is on another order than the USED one.
            otherRedemptions: others
              .filter((o) => !orders.includes(o))
              .map((orderNo) => ({ id: `5${orderNo}`, orderNo, status: 'CANCELLED' })),
            activeHolds: holds.map((orderNo, i) => ({ id: `9${i}`, orderNo, expiresAt: HOLD_EXPIRY })),
          });
          const fixed = applyPlan(before);
          expect(diagnoseUserCoupon(fixed)).toBeNull();
          if (fixed !== before && fixed.status === 'LOCKED') expect(fixed.activeHolds.length).toBeGreaterThan(0);
          if (before.status === 'LOCKED' && fixed.status !== 'LOCKED') expect(fixed.activeHolds).toEqual([]);
        },
      ),
      { numRuns: 5000 },
    );
  });

  it('a LOCKED coupon an order used: its holds close in the same repair, the using order’s confirmed (invariant 6)', () => {
    const locked = log([null, 'UNUSED'], ['UNUSED', 'LOCKED', 'hold:H']);
    expect(plan(facts('LOCKED', locked, ['X'], { activeHolds: [{ id: '50', orderNo: 'H', expiresAt: HOLD_EXPIRY }] }))?.steps).toEqual([
      { op: 'CLOSE_HOLDS', holds: [{ holdId: '50', closeAs: 'RELEASED' }] },
      { op: 'TRANSIT', from: 'LOCKED', to: 'USED', txId: 'order:X' },
    ]);
    expect(plan(facts('LOCKED', locked, ['H'], { activeHolds: [{ id: '50', orderNo: 'H', expiresAt: HOLD_EXPIRY }] }))?.steps[0]).toEqual({
      op: 'CLOSE_HOLDS',
      holds: [{ holdId: '50', closeAs: 'CONFIRMED' }],
    });
    // LOCKED with a log that never got there and no hold holding it: not repaired into LOCKED
    expect(plan(facts('LOCKED', log([null, 'UNUSED'])))?.steps).toEqual([{ op: 'SET_STATUS', from: 'LOCKED', to: 'UNUSED' }]);
    expect(
      plan(facts('LOCKED', log([null, 'UNUSED']), [], { activeHolds: [{ id: '50', orderNo: 'H', expiresAt: HOLD_EXPIRY }] }))?.steps,
    ).toEqual([{ op: 'APPEND_LOG', rows: [{ from: 'UNUSED', to: 'LOCKED', txId: null, reason: null, createdAt: null }] }]);
  });

  it('a status outside the lifecycle goes back to where the log left it', () => {
    expect(plan(facts(BOGUS, log([null, 'UNUSED'])))?.steps).toEqual([{ op: 'SET_STATUS', from: BOGUS, to: 'UNUSED' }]);
    expect(plan(facts(BOGUS, log([null, 'UNUSED'], ['UNUSED', 'EXPIRED'])))?.steps).toEqual([
      { op: 'SET_STATUS', from: BOGUS, to: 'EXPIRED' },
    ]);
    expect(plan(facts(BOGUS, [])))?.toMatchObject({ steps: [{ op: 'APPEND_LOG' }, { op: 'SET_STATUS', from: BOGUS, to: 'UNUSED' }] });
    expect(plan(facts(BOGUS, log([null, 'UNUSED']), ['A']))?.steps.at(-1)).toEqual({ op: 'SET_STATUS', from: BOGUS, to: 'USED' });
  });

  it('a redemption row of the using order with a status the service never writes is set back, not inserted again', () => {
    const used = log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:A']);
    const d = diagnoseUserCoupon(facts('USED', used, [], { otherRedemptions: [{ id: '40', orderNo: 'A', status: 'CANCELLED' }] }));
    expect(d).toMatchObject({
      type: 'USED_WITHOUT_REDEMPTION',
      params: { steps: [{ op: 'RESTORE_REDEMPTION', redemptionId: '40', from: 'CANCELLED' }] },
    });
  });

  it('a coupon used by two orders is left to an operator', () => {
    expect(diagnoseUserCoupon(facts('USED', log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:A']), ['A', 'B']))).toMatchObject({
      type: 'REDEMPTION_WITHOUT_USED',
      action: 'MANUAL_REVIEW',
      redemptionId: '101',
      params: { userCouponId: '7', redemptionIds: ['100', '101'] },
    });
  });

  it('says why as stable keys with the values they name, as well as in English, sentence by sentence', () => {
    const used = log([null, 'UNUSED'], ['UNUSED', 'USED', 'order:A']);
    const restored = diagnoseUserCoupon(facts('USED', used, [], { otherRedemptions: [{ id: '40', orderNo: 'A', status: 'CANCELLED' }] }));
    expect(restored?.details).toMatchObject({
      explanation:
        `The log records its use (order:A, log row ${used[1].id}) but the redemption row is missing: recreate it from the log. ` +
        'Its row (40) is there with the status CANCELLED: it goes back to USED.',
      explanationParts: [
        { key: 'USE_LOGGED_REDEMPTION_MISSING', params: { txId: 'order:A', logId: used[1].id } },
        { key: 'REDEMPTION_ROW_RESTORED', params: { redemptionId: '40', redemptionStatus: 'CANCELLED' } },
      ],
    });
    expect(diagnoseUserCoupon(facts('LOCKED', log([null, 'UNUSED'])))?.details).toMatchObject({
      // Not "The status LOCKED stands" first: the next sentence took it back.
      explanation: 'No ACTIVE hold holds it, so it goes back to UNUSED.',
      explanationParts: [{ key: 'NO_HOLD_BACK_TO_UNUSED', params: {} }],
    });
    expect(diagnoseUserCoupon(facts('USED', used, ['A', 'B']))?.details).toMatchObject({
      explanation:
        '2 USED redemptions (orders A, B) reference this one coupon: it was used more than once. Which use stands is for an operator to decide.',
      explanationParts: [{ key: 'USED_MORE_THAN_ONCE', params: { count: 2, orderNos: 'A, B' } }],
    });
    expect(diagnoseStock({ couponId: '1', initStock: 5, stock: 2, issuedFromStock: 6 })?.details).toMatchObject({
      explanation:
        '6 coupons were issued from stock, more than the initial 5, and 2 remain: end the sale at what was issued (initial stock 6, none remaining).',
      explanationParts: [{ key: 'STOCK_OVER_ISSUED', params: { issuedFromStock: 6, initStock: 5, stock: 2 } }],
    });
    expect(diagnoseMissingStock('1', 4).details).toMatchObject({
      explanation:
        'The coupon has no stock row: recreate it sold out (initial stock = the 4 issued, none remaining); add stock afterwards if the sale goes on.',
      explanationParts: [{ key: 'STOCK_ROW_MISSING', params: { issuedFromStock: 4 } }],
    });
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
    // An excess already grabbed, or a stock below zero: no removal can balance it.
    expect(diagnoseStock({ couponId: '1', initStock: 5, stock: 2, issuedFromStock: 6 })).toMatchObject({
      action: 'ADOPT_ISSUED',
      params: { difference: -3 },
    });
    expect(diagnoseStock({ couponId: '1', initStock: 10, stock: -1, issuedFromStock: 11 })).toMatchObject({
      action: 'ADOPT_ISSUED',
      params: { difference: 0 },
    });
  });
});
