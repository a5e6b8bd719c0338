import type { DataSource } from 'typeorm';
import { checkInvariants } from '../../src/ledger/invariants.js';
import type { Answer, Shot } from './load.js';
import { answerClass } from './stats.js';

export interface Expectation {
  /** Demand exceeds stock and nothing throttles it: the coupon must sell out exactly. */
  sellsOut: boolean;
  /** The answer classes this run may give; any other (a 5xx, a transport error) is a violation. */
  allowedAnswers: readonly string[];
}

export interface Verification {
  initStock: number;
  stockLeft: number;
  issued: number;
  /** Coupons issued beyond the initial stock. */
  oversold: number;
  usersWithTwo: number;
  violations: string[];
}

/**
 * Checks one grab run against the database, independently of the code under test: the stock
 * arithmetic, one coupon per user, every 2xx answer backed by its row (and every row by a 2xx
 * answer), every issued coupon's `null -> UNUSED` log row, and API.md's invariants on the whole database.
 * A load generator that reports counts, not answers (wrk), gives `{ counts, inFlightAtEnd }`: then
 * the issued coupons must be the 2xx answers, by number, plus at most the requests left in flight.
 */
export async function verifyGrabRun(
  db: DataSource,
  couponId: string,
  shots: readonly Shot[],
  answers: readonly Answer[] | { counts: Record<string, number>; inFlightAtEnd: number },
  expect: Expectation,
): Promise<Verification> {
  const violations: string[] = [];
  const [stock] = (await db.query(`SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, [couponId])) as {
    init_stock: string;
    stock: string;
  }[];
  const rows = (await db.query(`SELECT id, user_id, idempotency_key, from_stock FROM user_coupon WHERE coupon_id = ? AND source = 'GRAB'`, [
    couponId,
  ])) as {
    id: string;
    user_id: string;
    idempotency_key: string | null;
    from_stock: number;
  }[];
  const initStock = Number(stock.init_stock);
  const stockLeft = Number(stock.stock);
  const issued = rows.filter((r) => Number(r.from_stock) === 1).length;

  if (initStock !== stockLeft + issued) violations.push(`init_stock ${initStock} != stock ${stockLeft} + issued ${issued}`);
  if (stockLeft < 0) violations.push(`stock is negative: ${stockLeft}`);
  if (issued > initStock) violations.push(`oversold: ${issued} issued from a stock of ${initStock}`);
  if (expect.sellsOut && (issued !== initStock || stockLeft !== 0))
    violations.push(`expected a sell-out of exactly ${initStock}; issued ${issued}, stock left ${stockLeft}`);

  const perUser = new Map<string, number>();
  for (const r of rows) perUser.set(r.user_id, (perUser.get(r.user_id) ?? 0) + 1);
  const usersWithTwo = [...perUser.values()].filter((n) => n > 1).length;
  if (usersWithTwo > 0) violations.push(`${usersWithTwo} users hold more than one coupon (limit 1)`);

  if (!Array.isArray(answers)) {
    // A run for a fixed time stops reading with up to one request in flight per connection, which the server may still commit.
    const { counts, inFlightAtEnd } = answers as { counts: Record<string, number>; inFlightAtEnd: number };
    const ok = counts.SUCCESS ?? 0;
    if (ok > rows.length || rows.length > ok + inFlightAtEnd)
      violations.push(
        `${ok} 2xx answers for ${rows.length} user coupons issued (at most ${inFlightAtEnd} unanswered allowed: in flight at the end)`,
      );
    violations.push(...countViolations(counts, expect.allowedAnswers));
  }
  const byId = new Map(rows.map((r) => [String(r.id), r]));
  const answered = new Set<string>(Array.isArray(answers) ? [] : rows.map((r) => String(r.id)));
  for (const a of Array.isArray(answers) ? (answers as readonly Answer[]) : []) {
    if (answerClass(a) !== 'SUCCESS') continue;
    const row = a.id === null ? undefined : byId.get(a.id);
    const shot = shots[a.shot];
    if (!row) violations.push(`2xx answer to ${shot.userId} names user coupon ${a.id}, which is not in the database`);
    else if (row.user_id !== shot.userId || row.idempotency_key !== shot.key)
      violations.push(`user coupon ${a.id} answered to ${shot.userId}/${shot.key} belongs to ${row.user_id}/${row.idempotency_key}`);
    else if (answered.has(row.id)) violations.push(`user coupon ${a.id} was answered twice`);
    answered.add(String(a.id));
  }
  const unanswered = rows.filter((r) => !answered.has(String(r.id))).length;
  if (unanswered > 0) violations.push(`${unanswered} user coupons were issued without a 2xx answer`);

  const unlogged = (await db.query(
    `SELECT uc.id, COUNT(l.id) AS n FROM user_coupon uc
     LEFT JOIN user_coupon_state_log l ON l.user_coupon_id = uc.id AND l.from_status IS NULL AND l.to_status = 'UNUSED'
     WHERE uc.coupon_id = ? GROUP BY uc.id HAVING n <> 1`,
    [couponId],
  )) as { id: string; n: string }[];
  if (unlogged.length > 0)
    violations.push(`${unlogged.length} user coupons do not have exactly one null -> UNUSED log row (first: ${unlogged[0].id})`);

  if (Array.isArray(answers)) violations.push(...answerViolations(answers as readonly Answer[], expect.allowedAnswers));
  violations.push(...(await checkInvariants(db)).map((v) => `invariant ${v}`));
  return { initStock, stockLeft, issued, oversold: Math.max(0, issued - initStock), usersWithTwo, violations };
}

/** One line per unexpected answer class, with how many and the first message of a transport error. */
export function answerViolations(answers: readonly Answer[], allowed: readonly string[]): string[] {
  const unexpected = new Map<string, { n: number; first: string }>();
  for (const a of answers) {
    const c = answerClass(a);
    if (allowed.includes(c)) continue;
    const u = unexpected.get(c) ?? { n: 0, first: a.code ?? '' };
    u.n++;
    unexpected.set(c, u);
  }
  return [...unexpected].map(
    ([c, u]) => `${u.n} answers were ${c}${u.first && u.first !== c ? ` (${u.first})` : ''}, which this run must not give`,
  );
}

/** answerViolations for a load generator that reports counts by class (wrk). */
export function countViolations(counts: Record<string, number>, allowed: readonly string[]): string[] {
  return Object.entries(counts)
    .filter(([c]) => !allowed.includes(c))
    .map(([c, n]) => `${n} answers were ${c}, which this run must not give`);
}
