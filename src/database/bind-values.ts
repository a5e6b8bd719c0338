import mysql2 from 'mysql2';

/** The connections' time zone (data-source-options.ts): DATETIME values are written and read as UTC. */
export const SESSION_TIME_ZONE = 'Z';

/**
 * A multi-row statement's bind values with each distinct instant formatted once. A grab group's
 * rows share a few instants (issued, valid from, expires, logged), and the driver would format every
 * Date anew: five per issued coupon, the largest allocation of the grab's SQL.
 */
export function withDatesFormattedOnce(values: readonly unknown[]): unknown[] {
  const formatted = new Map<number, unknown>();
  return values.map((v) => {
    if (!(v instanceof Date)) return v;
    const t = v.getTime();
    let sql = formatted.get(t);
    if (sql === undefined) formatted.set(t, (sql = mysql2.raw(mysql2.escape(v, false, SESSION_TIME_ZONE))));
    return sql;
  });
}
