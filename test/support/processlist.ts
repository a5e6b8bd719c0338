import type { DataSource } from 'typeorm';

/**
 * Until another connection to this test's database is running a statement matching `like` (a SQL
 * LIKE pattern, or any of several): for instance waiting on a row lock the test holds. Throws after `ms`.
 */
export async function waitForStatement(db: DataSource, like: string | string[], ms = 5000): Promise<void> {
  const patterns = typeof like === 'string' ? [like] : like;
  for (const until = Date.now() + ms; ; await new Promise((r) => setTimeout(r, 20))) {
    const [{ n }] = (await db.query(
      `SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST
       WHERE DB = DATABASE() AND (${patterns.map(() => 'INFO LIKE ?').join(' OR ')}) AND ID <> CONNECTION_ID()`,
      patterns,
    )) as { n: string }[];
    if (Number(n) > 0) return;
    if (Date.now() > until) throw new Error(`no statement like ${like} ran within ${ms} ms`);
  }
}
