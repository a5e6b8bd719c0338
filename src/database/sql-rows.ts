import mysql2, { type SqlValue } from 'mysql2';

/** The connections' time zone (data-source-options.ts): DATETIME values are written and read as UTC. */
export const SESSION_TIME_ZONE = 'Z';

/** A value as the driver writes it for a `?` placeholder on these connections. */
export function sqlLiteral(value: SqlValue): string {
  return mysql2.escape(value, false, SESSION_TIME_ZONE);
}

/**
 * The connections' `queryFormat`: the driver's own placeholder formatting, except that a statement
 * without values goes as written. The driver formats every statement, and with no values it still
 * scans the whole text for a `?`: the ledger's multi-row statements carry their values as literals
 * (rowsSql below), a 1,000-grab group's INSERT is some 200 KB, and that scan was a tenth of the
 * driver's time in the grouped grab's profile.
 */
export function formatQuery(this: { config: { stringifyObjects?: boolean } }, sql: string, values: unknown, timeZone: string): string {
  if (values === undefined || (Array.isArray(values) && values.length === 0)) return sql;
  return mysql2.format(sql, values as SqlValue[], this.config.stringifyObjects ?? false, timeZone);
}

const same = (a: unknown, b: unknown) => a === b || (a instanceof Date && b instanceof Date && a.getTime() === b.getTime());

/**
 * `(a, b), (c, d)` for a multi-row statement, each value escaped as a `?` would be. Written here
 * rather than through placeholders, because the driver's formatting was the grab group's largest
 * cost in this process: it concatenates two pieces per placeholder, and a 1,000-grab group's
 * INSERT has 14,000 of them. Here each row is joined once, and a value equal to the one above it in
 * its column (the coupon, status, source, the group's instants) is escaped once.
 */
export function rowsSql(rows: readonly (readonly SqlValue[])[]): string {
  const out = new Array<string>(rows.length);
  let above: readonly SqlValue[] = [];
  let aboveSql: string[] = [];
  for (let r = 0; r < rows.length; r++) {
    const row = rows[r];
    const sql = new Array<string>(row.length);
    for (let c = 0; c < row.length; c++) sql[c] = c < above.length && same(row[c], above[c]) ? aboveSql[c] : sqlLiteral(row[c]);
    out[r] = `(${sql.join(', ')})`;
    above = row;
    aboveSql = sql;
  }
  return out.join(', ');
}
