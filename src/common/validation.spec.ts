import { randomBytes } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import { decimalUpTo, ID_PATTERN } from './validation.js';

const MAX = 9223372036854775807n;

describe('ID_PATTERN: the ids 1..2^63-1', () => {
  it.each(['1', '9', '10', '1024', '999999999999999999', '1000000000000000000', '9223372036854775806', '9223372036854775807'])(
    'accepts %s',
    (id) => {
      expect(ID_PATTERN.test(id)).toBe(true);
    },
  );

  it.each([
    '0',
    '01',
    '-1',
    '',
    '1.5',
    ' 1',
    '1 ',
    '9223372036854775808',
    '9223372036854775810',
    '9300000000000000000',
    '9999999999999999999',
    '10000000000000000000',
    '09223372036854775807',
  ])('refuses %j', (id) => {
    expect(ID_PATTERN.test(id)).toBe(false);
  });

  it('agrees with BigInt on random 19-digit numbers, near the bound, and on every digit of the bound changed', () => {
    const fits = (s: string) => /^[1-9][0-9]*$/.test(s) && BigInt(s) <= MAX;
    const below = (n: bigint) => BigInt(`0x${randomBytes(8).toString('hex')}`) % n;
    const samples: string[] = [];
    for (let i = 0; i < 3000; i++) samples.push((10n ** 18n + below(9n * 10n ** 18n)).toString());
    // Within 10^k of the bound, both sides, for every k: each level of the pattern's nesting.
    for (let k = 1n; k <= 18n; k++) for (let i = 0; i < 100; i++) samples.push((MAX - 10n ** k + below(2n * 10n ** k)).toString());
    const bound = MAX.toString();
    for (let i = 0; i < bound.length; i++) for (let d = 0; d <= 9; d++) samples.push(bound.slice(0, i) + d + bound.slice(i + 1));
    expect(samples.filter((s) => ID_PATTERN.test(s) !== fits(s))).toEqual([]);
    // The samples do land on both sides.
    expect(new Set(samples.map(fits))).toEqual(new Set([true, false]));
  });
});

describe('decimalUpTo', () => {
  it.each([1, 9, 10, 19, 100, 101, 250, 999, 1000, 4096, 70309])('matches exactly 1..%i and no leading zero', (max) => {
    const re = new RegExp(decimalUpTo(BigInt(max)));
    const last = max * 10 + 20;
    const wrong: number[] = [];
    for (let v = 0; v <= last; v++) if (re.test(String(v)) !== (v >= 1 && v <= max)) wrong.push(v);
    expect(wrong).toEqual([]);
    expect(re.test(`0${max}`)).toBe(false);
  });

  it('refuses a bound below 1', () => {
    expect(() => decimalUpTo(0n)).toThrow(RangeError);
  });
});
