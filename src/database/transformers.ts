/**
 * BIGINT columns come back from mysql2 as strings (bigNumberStrings keeps ids exact). Counts and
 * cents stay far below 2^53, so those columns are read as numbers.
 */
export const bigintAsNumber = { to: (v: number) => v, from: (v: string | number) => Number(v) };
export const nullableBigintAsNumber = {
  to: (v: number | null) => v,
  from: (v: string | number | null) => (v === null ? null : Number(v)),
};
