import type { DataSource, EntityManager } from 'typeorm';

type Queryable = Pick<DataSource | EntityManager, 'query'>;

/** Only the user coupons of these coupon templates (and what hangs off them) are checked. */
export interface InvariantScope {
  couponIds: readonly string[];
}

/**
 * The invariants of API.md, checked directly in SQL and independently of the service's own code
 * (its own copy of the legal moves, on purpose). Returns one line per violation; an empty list
 * means the database, or the coupons in `scope`, are consistent. Used by the tests, the fault
 * suite, the benchmark and `npm run check:invariants`.
 */
export async function checkInvariants(db: Queryable, scope?: InvariantScope): Promise<string[]> {
  if (scope && scope.couponIds.length === 0) return [];
  const ids = scope ? [scope.couponIds] : [];
  /** ` AND <column> IN (...)` when scoped: `column` holds a coupon template id. */
  const and = (column: string) => (scope ? ` AND ${column} IN (?)` : '');
  const violations: string[] = [];
  const add = (label: string, rows: unknown[]) => {
    for (const r of rows) violations.push(`${label}: ${JSON.stringify(r)}`);
  };
  // 1. init_stock == stock + issued from stock, stock >= 0
  add(
    'stock',
    await db.query(
      `
      SELECT s.coupon_id, s.init_stock, s.stock, COALESCE(i.issued, 0) AS issued
      FROM coupon_stock s
      LEFT JOIN (SELECT coupon_id, COUNT(*) AS issued FROM user_coupon WHERE from_stock = 1 GROUP BY coupon_id) i ON i.coupon_id = s.coupon_id
      WHERE (s.stock < 0 OR s.init_stock <> s.stock + COALESCE(i.issued, 0))${and('s.coupon_id')}`,
      ids,
    ),
  );
  // 2. per-user limit on coupons from grabs and bulk issuance together
  add(
    'per-user limit',
    await db.query(
      `
      SELECT uc.coupon_id, uc.user_id, COUNT(*) AS held, c.per_user_limit
      FROM user_coupon uc JOIN coupon c ON c.id = uc.coupon_id
      WHERE uc.source IN ('GRAB', 'BULK')${and('uc.coupon_id')}
      GROUP BY uc.coupon_id, uc.user_id, c.per_user_limit
      HAVING COUNT(*) > c.per_user_limit`,
      ids,
    ),
  );
  // 3. (user, key) and (order, user coupon) unique: enforced by keys; checked in case a key is ever dropped
  add(
    'idempotency',
    await db.query(
      `SELECT user_id, idempotency_key, COUNT(*) n FROM user_coupon WHERE idempotency_key IS NOT NULL${and('coupon_id')} GROUP BY user_id, idempotency_key HAVING n > 1`,
      ids,
    ),
  );
  add(
    'redemption key',
    await db.query(
      `SELECT r.order_no, r.user_coupon_id, COUNT(*) n FROM redemption r${scope ? ' JOIN user_coupon uc ON uc.id = r.user_coupon_id WHERE uc.coupon_id IN (?)' : ''} GROUP BY r.order_no, r.user_coupon_id HAVING n > 1`,
      ids,
    ),
  );
  // 4. USED exactly when one USED redemption references it
  add(
    'used/redemption',
    await db.query(
      `
      SELECT uc.id, uc.status, COALESCE(r.n, 0) AS used_redemptions
      FROM user_coupon uc
      LEFT JOIN (SELECT user_coupon_id, COUNT(*) n FROM redemption WHERE status = 'USED' GROUP BY user_coupon_id) r ON r.user_coupon_id = uc.id
      WHERE ((uc.status = 'USED') <> (COALESCE(r.n, 0) = 1) OR COALESCE(r.n, 0) > 1)${and('uc.coupon_id')}`,
      ids,
    ),
  );
  // A redemption whose coupon row is gone belongs to no template, so only the whole database can show it.
  if (!scope) {
    add(
      'orphan redemption',
      await db.query(`SELECT r.id FROM redemption r LEFT JOIN user_coupon uc ON uc.id = r.user_coupon_id WHERE uc.id IS NULL`),
    );
  }
  add(
    'redemption owner',
    await db.query(
      `SELECT r.id, r.user_id, uc.user_id AS owner FROM redemption r JOIN user_coupon uc ON uc.id = r.user_coupon_id WHERE r.user_id <> uc.user_id${and('uc.coupon_id')}`,
      ids,
    ),
  );
  add(
    'used_at',
    await db.query(
      `SELECT id, status, used_at FROM user_coupon WHERE (status NOT IN ('UNUSED', 'LOCKED', 'USED', 'EXPIRED', 'VOID') OR (status = 'USED') <> (used_at IS NOT NULL))${and('coupon_id')}`,
      ids,
    ),
  );
  // Where a coupon comes from decides whether it took stock; a mismatch would silently break invariant 1.
  add(
    'source/from_stock',
    await db.query(
      `SELECT id, source, from_stock FROM user_coupon WHERE (source NOT IN ('GRAB', 'BULK', 'REISSUE', 'REFUND_RETURN') OR (source = 'GRAB' AND from_stock = 0) OR (source = 'REFUND_RETURN' AND from_stock = 1))${and('coupon_id')}`,
      ids,
    ),
  );
  // A refund and its replacement coupon are one transaction: neither may exist without the other.
  add(
    'refund',
    await db.query(
      `
      SELECT f.id, f.refund_no
      FROM refund f
      LEFT JOIN redemption r ON r.id = f.redemption_id AND r.user_coupon_id = f.user_coupon_id AND r.order_no = f.order_no
      LEFT JOIN user_coupon rep ON rep.id = f.replacement_user_coupon_id
      WHERE (r.id IS NULL
         OR (f.replacement_user_coupon_id IS NOT NULL AND (rep.id IS NULL OR rep.source <> 'REFUND_RETURN' OR rep.replaces_user_coupon_id <> f.user_coupon_id)))${scope ? ' AND f.user_coupon_id IN (SELECT id FROM user_coupon WHERE coupon_id IN (?))' : ''}`,
      ids,
    ),
  );
  add(
    'refund return without refund',
    await db.query(
      `SELECT uc.id FROM user_coupon uc LEFT JOIN refund f ON f.replacement_user_coupon_id = uc.id WHERE uc.source = 'REFUND_RETURN' AND f.id IS NULL${and('uc.coupon_id')}`,
      ids,
    ),
  );
  // 6. LOCKED exactly when one ACTIVE hold references it, and the coupon knows when that hold times out
  add(
    'locked/hold',
    await db.query(
      `
      SELECT uc.id, uc.status, uc.locked_until, COALESCE(h.n, 0) AS active_holds, h.expires_at
      FROM user_coupon uc
      LEFT JOIN (SELECT user_coupon_id, COUNT(*) n, MAX(expires_at) expires_at FROM redemption_hold WHERE status = 'ACTIVE' GROUP BY user_coupon_id) h
        ON h.user_coupon_id = uc.id
      WHERE ((uc.status = 'LOCKED') <> (COALESCE(h.n, 0) = 1) OR COALESCE(h.n, 0) > 1 OR (uc.status = 'LOCKED' AND NOT (uc.locked_until <=> h.expires_at)))${and('uc.coupon_id')}`,
      ids,
    ),
  );
  // A hold whose coupon row is gone belongs to no template either: only the whole database shows it.
  add(
    'hold',
    await db.query(
      `
      SELECT h.id, h.status, h.release_reason, r.id AS redemption_id
      FROM redemption_hold h
      LEFT JOIN user_coupon uc ON uc.id = h.user_coupon_id
      LEFT JOIN redemption r ON r.order_no = h.order_no AND r.user_coupon_id = h.user_coupon_id AND r.status = 'USED'
      WHERE (uc.id IS NULL OR h.user_id <> uc.user_id OR h.status NOT IN ('ACTIVE', 'CONFIRMED', 'RELEASED')
         OR (h.status = 'CONFIRMED') <> (r.id IS NOT NULL AND r.discount_cents = h.discount_cents)
         OR (h.status = 'RELEASED') <> (h.released_at IS NOT NULL AND h.release_reason IS NOT NULL))${and('uc.coupon_id')}`,
      ids,
    ),
  );
  // Orders: the discounts on one order (USED redemptions and ACTIVE holds) never exceed its amount,
  // more than one coupon only when all are stackable, and every hold and redemption names one amount.
  // A hold past its time is on no order: it behaves as released everywhere before the sweep stores
  // that (API.md), so another coupon, at another amount, may take the order meanwhile.
  // Scoped: the orders that use at least one of the coupons, each checked whole.
  add(
    'order discounts',
    await db.query(
      `
      SELECT x.order_no, SUM(x.discount_cents) AS discounts, COUNT(*) AS coupons, SUM(c.stackable = 0) AS not_stackable,
             MIN(x.order_amount_cents) AS lo, MAX(x.order_amount_cents) AS hi
      FROM (
        SELECT order_no, user_coupon_id, discount_cents, order_amount_cents FROM redemption_hold WHERE status = 'ACTIVE' AND expires_at > ?
        UNION ALL
        SELECT order_no, user_coupon_id, discount_cents, order_amount_cents FROM redemption WHERE status = 'USED'
      ) x
      JOIN user_coupon uc ON uc.id = x.user_coupon_id JOIN coupon c ON c.id = uc.coupon_id
      GROUP BY x.order_no
      HAVING (SUM(x.discount_cents) > MIN(x.order_amount_cents) OR (COUNT(*) > 1 AND SUM(c.stackable = 0) > 0)
          OR MIN(x.order_amount_cents) <> MAX(x.order_amount_cents))${scope ? ' AND SUM(uc.coupon_id IN (?)) > 0' : ''}`,
      [new Date(), ...ids],
    ),
  );
  // 5. the log replays to the current status through legal steps
  const logs: { id: string; status: string; steps: string | null }[] = await db.query(
    `
    SELECT uc.id, uc.status, GROUP_CONCAT(CONCAT(COALESCE(l.from_status, 'null'), '>', l.to_status) ORDER BY l.id SEPARATOR ',') AS steps
    FROM user_coupon uc LEFT JOIN user_coupon_state_log l ON l.user_coupon_id = uc.id
    ${scope ? 'WHERE uc.coupon_id IN (?)' : ''}
    GROUP BY uc.id, uc.status`,
    ids,
  );
  const legal: Record<string, string[]> = {
    null: ['UNUSED'],
    UNUSED: ['LOCKED', 'USED', 'EXPIRED', 'VOID'],
    LOCKED: ['USED', 'UNUSED', 'EXPIRED'],
    EXPIRED: ['VOID'],
    USED: [],
    VOID: [],
  };
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
