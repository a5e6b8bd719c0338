import { describe, expect, it } from '@jest/globals';
import { codePointPrefix } from './state-log.js';

describe('codePointPrefix', () => {
  const emoji = '\u{1F600}';

  it.each([
    ['abc', 5, 'abc'],
    ['abcdef', 3, 'abc'],
    [emoji.repeat(3), 3, emoji.repeat(3)],
    [emoji.repeat(3), 2, emoji.repeat(2)],
    [`a${emoji}b`, 2, `a${emoji}`],
    [`${emoji}${emoji}`, 1, emoji],
    ['a\ud800bc', 2, 'a\ud800'],
    [emoji, 0, ''],
  ])('%j cut to %i code points is %j', (text, max, prefix) => {
    expect(codePointPrefix(text, max)).toBe(prefix);
  });

  it('never splits a surrogate pair, at any length', () => {
    const text = `a${emoji}${'b'.repeat(3)}${emoji.repeat(4)}c`;
    for (let max = 0; max <= 12; max++) expect(codePointPrefix(text, max)).toBe([...text].slice(0, max).join(''));
  });
});
