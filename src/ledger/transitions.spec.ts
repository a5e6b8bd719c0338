import { describe, expect, it } from '@jest/globals';
import { isLegal, LogStep, replay, TRANSITIONS, USER_COUPON_STATUSES, UserCouponStatus } from './transitions.js';

const FROM: (UserCouponStatus | null)[] = [null, ...USER_COUPON_STATUSES];

// Written out independently of TRANSITIONS, so a wrong edit of the table fails here.
const LEGAL = new Set([
  'null>UNUSED',
  'UNUSED>LOCKED',
  'UNUSED>USED',
  'UNUSED>EXPIRED',
  'UNUSED>VOID',
  'LOCKED>USED',
  'LOCKED>UNUSED',
  'LOCKED>EXPIRED',
  'EXPIRED>VOID',
]);
const key = (from: UserCouponStatus | null, to: UserCouponStatus) => `${from ?? 'null'}>${to}`;
const allPairs = FROM.flatMap((from) => USER_COUPON_STATUSES.map((to) => ({ from, to })));

describe('transitions table', () => {
  it.each(allPairs.filter((p) => LEGAL.has(key(p.from, p.to))))('allows $from -> $to', ({ from, to }) => {
    expect(isLegal(from, to)).toBe(true);
  });

  it.each(allPairs.filter((p) => !LEGAL.has(key(p.from, p.to))))('refuses $from -> $to', ({ from, to }) => {
    expect(isLegal(from, to)).toBe(false);
  });

  it('has exactly the legal moves of the contract and USED, VOID final', () => {
    const table = Object.entries(TRANSITIONS).flatMap(([from, tos]) => tos.map((to) => `${from}>${to}`));
    expect(new Set(table)).toEqual(LEGAL);
    expect(table).toHaveLength(LEGAL.size);
    expect(TRANSITIONS.USED).toEqual([]);
    expect(TRANSITIONS.VOID).toEqual([]);
  });
});

const steps = (...path: (UserCouponStatus | null)[]): LogStep[] =>
  path.slice(1).map((to, i) => ({ from: path[i], to: to as UserCouponStatus }));

describe('replay', () => {
  it('gives null for an empty log', () => {
    expect(replay([])).toEqual({ status: null, lastConsistentIndex: -1, legal: true });
  });

  it.each([
    [[null, 'UNUSED'], 'UNUSED'],
    [[null, 'UNUSED', 'USED'], 'USED'],
    [[null, 'UNUSED', 'EXPIRED'], 'EXPIRED'],
    [[null, 'UNUSED', 'VOID'], 'VOID'],
    [[null, 'UNUSED', 'EXPIRED', 'VOID'], 'VOID'],
    [[null, 'UNUSED', 'LOCKED', 'USED'], 'USED'],
    [[null, 'UNUSED', 'LOCKED', 'UNUSED', 'LOCKED', 'EXPIRED', 'VOID'], 'VOID'],
  ] as [(UserCouponStatus | null)[], UserCouponStatus][])('replays every legal lifecycle %j to %s', (path, end) => {
    expect(replay(steps(...path))).toEqual({ status: end, lastConsistentIndex: path.length - 2, legal: true });
  });

  it('stops at a step that does not start where the previous one ended (a deleted log row)', () => {
    const log: LogStep[] = [
      { from: null, to: 'UNUSED' },
      { from: 'EXPIRED', to: 'VOID' },
    ];
    expect(replay(log)).toEqual({ status: 'UNUSED', lastConsistentIndex: 0, legal: false });
  });

  it('refuses a log that does not start with the issuance', () => {
    expect(replay([{ from: 'UNUSED', to: 'USED' }])).toEqual({ status: null, lastConsistentIndex: -1, legal: false });
  });

  it.each(allPairs.filter((p) => p.from !== null && !LEGAL.has(key(p.from, p.to))))(
    'refuses the illegal step $from -> $to after reaching $from',
    ({ from, to }) => {
      const path = from === 'UNUSED' ? steps(null, 'UNUSED') : steps(null, 'UNUSED', from);
      const r = replay([...path, { from, to }]);
      expect(r).toEqual({ status: from, lastConsistentIndex: path.length - 1, legal: false });
    },
  );

  it('refuses a second issuance', () => {
    expect(replay(steps(null, 'UNUSED', 'USED').concat({ from: null, to: 'UNUSED' })).legal).toBe(false);
  });
});
