import { describe, expect, it } from '@jest/globals';
import mysql2, { type SqlValue } from 'mysql2';
import { formatQuery, rowsSql, SESSION_TIME_ZONE, sqlLiteral } from './sql-rows.js';

/** What the driver sends for the same rows written with `?` placeholders on these connections (TypeORM sets stringifyObjects). */
const viaPlaceholders = (rows: SqlValue[][]) =>
  mysql2.format(rows.map((r) => `(${r.map(() => '?').join(', ')})`).join(', '), rows.flat(), true, SESSION_TIME_ZONE);

describe('rowsSql', () => {
  const at = new Date('2026-12-01T10:20:30.456Z');
  it.each<[string, SqlValue[][]]>([
    ['one row', [['1', 'user-1', 'UNUSED', true, null, at]]],
    [
      'strings the escaping must get right',
      [
        ["o'neil", 'back\\slash', 'a"b', 'new\nline', 'nul\0byte', 'ctrl\x1az', 'what?', '优惠券 🎟️'],
        ["o'neil", 'back\\slash', 'a"b', 'new\nline', 'nul\0byte', 'ctrl\x1az', 'what??', '优惠券 🎟️'],
      ],
    ],
    [
      'equal values in a column, in separate Date objects, and changes between rows',
      [
        ['7', 'u1', new Date(at.getTime()), new Date(at.getTime() + 86_400_000), 0, false],
        ['7', 'u2', new Date(at.getTime()), new Date(at.getTime() + 86_400_000), 0, false],
        ['8', 'u2', new Date(at.getTime() + 1), null, 1.5, true],
        ['7', 'u2', at, null, 1.5, true],
      ],
    ],
    [
      'values that never equal the one above (NaN, an invalid Date), undefined, and rows of different widths',
      [
        [Number.NaN, new Date(Number.NaN), undefined],
        [Number.NaN, new Date(Number.NaN), undefined, 'extra'],
        [Number.NaN, new Date(Number.NaN), undefined, undefined, undefined],
      ],
    ],
  ])('writes what the driver would for %s', (_, rows) => {
    expect(rowsSql(rows)).toBe(viaPlaceholders(rows));
  });

  it('writes a literal as the driver writes a placeholder', () => {
    for (const v of ["it's", 42, null, at, false]) expect(sqlLiteral(v)).toBe(mysql2.format('?', [v], true, SESSION_TIME_ZONE));
  });
});

describe('formatQuery', () => {
  const at = new Date('2026-12-01T10:20:30.456Z');
  const values = [1, "it's", null, at, { a: 1 }, ['x', 'y'], 'what?'];
  const sql = 'SELECT ? AS a, ? AS b, ? AS c, ? AS d, ? AS e, ? IN (?)';

  it.each([true, false])('formats values as the driver does (stringifyObjects %s)', (stringifyObjects) => {
    expect(formatQuery.call({ config: { stringifyObjects } }, sql, values, SESSION_TIME_ZONE)).toBe(
      mysql2.format(sql, values as SqlValue[], stringifyObjects, SESSION_TIME_ZONE),
    );
  });

  it('sends a statement without values as written, a `?` in a literal included', () => {
    const literal = `SELECT 'what?' AS q, "a?b" AS r`;
    for (const none of [undefined, []]) {
      expect(formatQuery.call({ config: { stringifyObjects: true } }, literal, none, SESSION_TIME_ZONE)).toBe(literal);
      expect(formatQuery.call({ config: { stringifyObjects: true } }, literal, none, SESSION_TIME_ZONE)).toBe(
        mysql2.format(literal, [], true, SESSION_TIME_ZONE),
      );
    }
  });
});
