import type { DataSource, EntityManager } from 'typeorm';

type Queryable = Pick<DataSource | EntityManager, 'query'>;

/**
 * The invariants of API.md, checked directly in SQL and independently of the service's own code.
 * Returns one line per violation; an empty list means the database is consistent.
 */
export async function checkInvariants(db: Queryable): Promise<string[]> {
  const violations: string[] = [];
  const add = (label: string, rows: unknown[]) => {
    for (const r of rows) violations.push(`${label}: ${JSON.stringify(r)}`);
  };
  // 1. init_stock == stock + issued from stock, stock >= 0
  add(
    'stock',
    await db.query(`
      SELECT s.coupon_id, s.init_stock, s.stock, COALESCE(i.issued, 0) AS issued
      FROM coupon_stock s
      LEFT JOIN (SELECT coupon_id, COUNT(*) AS issued FROM user_coupon WHERE from_stock = 1 GROUP BY coupon_id) i ON i.coupon_id = s.coupon_id
      WHERE s.stock < 0 OR s.init_stock <> s.stock + COALESCE(i.issued, 0)`),
  );
  // 2. per-user limit on grabbed coupons
  add(
    'per-user limit',
    await db.query(`
      SELECT uc.coupon_id, uc.user_id, COUNT(*) AS grabbed, c.per_user_limit
      FROM user_coupon uc JOIN coupon c ON c.id = uc.coupon_id
      WHERE uc.source = 'GRAB'
      GROUP BY uc.coupon_id, uc.user_id, c.per_user_limit
      HAVING COUNT(*) > c.per_user_limit`),
  );
  // 3. (user, key) and (order, user coupon) unique: enforced by keys; checked in case a key is ever dropped
  add('idempotency', await db.query(`SELECT user_id, idempotency_key, COUNT(*) n FROM user_coupon WHERE idempotency_key IS NOT NULL GROUP BY user_id, idempotency_key HAVING n > 1`));
  add('redemption key', await db.query(`SELECT order_no, user_coupon_id, COUNT(*) n FROM redemption GROUP BY order_no, user_coupon_id HAVING n > 1`));
  // 4. USED exactly when one USED redemption references it
  add(
    'used/redemption',
    await db.query(`
      SELECT uc.id, uc.status, COALESCE(r.n, 0) AS used_redemptions
      FROM user_coupon uc
      LEFT JOIN (SELECT user_coupon_id, COUNT(*) n FROM redemption WHERE status = 'USED' GROUP BY user_coupon_id) r ON r.user_coupon_id = uc.id
      WHERE (uc.status = 'USED') <> (COALESCE(r.n, 0) = 1) OR COALESCE(r.n, 0) > 1`),
  );
  add('orphan redemption', await db.query(`SELECT r.id FROM redemption r LEFT JOIN user_coupon uc ON uc.id = r.user_coupon_id WHERE uc.id IS NULL`));
  // 5. the log replays to the current status through legal steps
  const logs: { id: string; status: string; steps: string | null }[] = await db.query(`
    SELECT uc.id, uc.status, GROUP_CONCAT(CONCAT(COALESCE(l.from_status, 'null'), '>', l.to_status) ORDER BY l.id SEPARATOR ',') AS steps
    FROM user_coupon uc LEFT JOIN user_coupon_state_log l ON l.user_coupon_id = uc.id
    GROUP BY uc.id, uc.status`);
  const legal: Record<string, string[]> = { null: ['UNUSED'], UNUSED: ['USED', 'EXPIRED', 'VOID'], EXPIRED: ['VOID'], USED: [], VOID: [] };
  for (const row of logs) {
    let state = 'null';
    let ok = true;
    for (const step of (row.steps ?? '').split(',').filter(Boolean)) {
      const [from, to] = step.split('>');
      if (from !== state || !legal[from]?.includes(to)) ok = false;
      state = to;
    }
    if (!ok || state !== row.status) violations.push(`log: ${JSON.stringify(row)}`);
  }
  return violations;
}
