import type { DataSource, EntityManager } from 'typeorm';

type Queryable = Pick<DataSource | EntityManager, 'query'>;

/**
 * A checksum of every table's content, keyed by table. Equal before and after a request means the
 * request wrote nothing (AUTO_INCREMENT counters, which a rolled-back insert may bump, are not content;
 * nor are tx_marker, where any committed transaction stamps its connection's row, read-only ones too,
 * and job_lease).
 * Pass `tables` (the keys of an earlier fingerprint) to skip looking them up on every call.
 */
export async function databaseFingerprint(db: Queryable, tables?: readonly string[]): Promise<Record<string, string>> {
  const names =
    tables ??
    (
      (await db.query(
        `SELECT table_name AS t FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name NOT IN ('tx_marker', 'job_lease') ORDER BY table_name`,
      )) as {
        t: string;
      }[]
    ).map((r) => r.t);
  const rows = (await db.query(`CHECKSUM TABLE ${names.map((t) => `\`${t}\``).join(', ')}`)) as {
    Table: string;
    Checksum: string | number | null;
  }[];
  return Object.fromEntries(rows.map((r) => [r.Table.slice(r.Table.indexOf('.') + 1), String(r.Checksum)]));
}
