import { jest } from '@jest/globals';
import request from 'supertest';
import { DataSource, EntityManager } from 'typeorm';
import { TransactionService } from '../src/database/transaction.service.js';
import { AppConfig } from '../src/config/app-config.js';
import { RECONCILIATION_LEASE, ReconciliationService, zoneBehindUtcMs } from '../src/reconciliation/reconciliation.service.js';
import { createCoupon, CouponInput, grabUserCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { tryAcquireLease } from '../src/database/lease.js';
import { AuditService } from '../src/reconciliation/audit.service.js';
import { interleaveBefore } from './support/interleave.js';

interface CompensationBody {
  id: string;
  status: string;
  action: string;
  params: { steps?: { op: string }[]; count?: number; difference?: number; orderNo?: string };
  result: unknown;
  decidedBy: string | null;
  decisionReason: string | null;
  decidedAt: string | null;
  discrepancy: {
    id: string;
    runId: string;
    type: string;
    couponId: string | null;
    userCouponId: string | null;
    redemptionId: string | null;
    details: { difference?: number; lastConsistentLogId?: string | null; targetStatus?: string; explanation?: string };
  };
}

describe('reconciliation', () => {
  let t: TestApp;
  let svc: ReconciliationService;
  const admin = () => bearer(adminToken());

  beforeAll(async () => {
    t = await startTestApp();
    svc = t.app.get(ReconciliationService);
  });
  afterAll(() => t.close());

  const sql = (q: string, params: unknown[] = []) => t.db.query(q, params);
  const one = async <T>(q: string, params: unknown[] = []) => ((await sql(q, params)) as T[])[0];

  async function coupon(overrides: CouponInput = {}): Promise<string> {
    return (await createCoupon(t.url, { totalStock: 20, perUserLimit: 5, ...overrides })).id;
  }
  async function grab(couponId: string, userId: string): Promise<string> {
    const res = await request(t.url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor(userId)))
      .set('Idempotency-Key', newKey());
    if (res.status !== 201) throw new Error(`grab: ${res.status} ${JSON.stringify(res.body)}`);
    return res.body.id as string;
  }
  async function redeem(userCouponId: string, userId: string, orderNo = newKey('order')): Promise<string> {
    const res = await request(t.url)
      .post('/redemptions')
      .set(bearer(serviceToken()))
      .send({ userCouponId, orderNo, orderAmountCents: 20000, userId });
    if (res.status !== 201) throw new Error(`redeem: ${res.status} ${JSON.stringify(res.body)}`);
    return res.body.redemptionId as string;
  }
  /** The order service's refund of a redeemed coupon (a new refund number unless one is given). */
  const refund = (userCouponId: string, orderNo: string, refundNo = newKey('refund')) =>
    request(t.url).post('/redemptions/refunds').set(bearer(serviceToken())).send({ userCouponId, orderNo, refundNo });
  /** A coupon that returns on refund, grabbed by `user`, used on an order and refunded. */
  async function refundedUse(user: string) {
    const c = await coupon({ returnOnRefund: true });
    const uc = await grab(c, user);
    const orderNo = newKey('order');
    const redemptionId = await redeem(uc, user, orderNo);
    const refunded = await refund(uc, orderNo);
    expect(refunded.status).toBe(201);
    return { c, uc, orderNo, redemptionId, refunded };
  }
  /** What a repair made before a recreated redemption took the id its refund names: the row under a new id, answered. */
  async function moveRedemption(id: string): Promise<string> {
    const { top } = await one<{ top: string }>(`SELECT MAX(id) AS top FROM redemption`);
    const moved = String(BigInt(top) + 1n);
    await sql(`UPDATE redemption SET id = ? WHERE id = ?`, [moved, id]);
    return moved;
  }
  async function proposals(runId: string): Promise<CompensationBody[]> {
    const res = await request(t.url).get(`/admin/compensations?status=PENDING&runId=${runId}&limit=100`).set(admin());
    expect(res.status).toBe(200);
    return res.body.items as CompensationBody[];
  }
  const decide = (id: string, decision: 'approve' | 'reject', reason = 'checked the order history') =>
    request(t.url).post(`/admin/compensations/${id}/${decision}`).set(admin()).send({ reason });
  /** Approves every open proposal, so each test starts from a consistent database. */
  async function settleAll(): Promise<void> {
    const res = await request(t.url).get('/admin/compensations?status=PENDING&limit=100').set(admin());
    for (const c of res.body.items as CompensationBody[]) expect((await decide(c.id, 'approve')).status).toBe(200);
  }

  it('a clean database gives a clean run that checks every row', async () => {
    const c = await coupon();
    const ucs = await Promise.all(['u1', 'u2', 'u3', 'u4'].map((u) => grab(c, u)));
    await redeem(ucs[0], 'u1');
    expect((await request(t.url).post(`/admin/user-coupons/${ucs[1]}/void`).set(admin()).send({ reason: 'test' })).status).toBe(200);

    const run = await svc.runNow('FULL', 'test');
    expect(run).toMatchObject({ status: 'COMPLETED', mode: 'FULL', discrepancies: 0, error: null });
    // 1 coupon stock row + 4 user coupons + 1 redemption (its order audited with it)
    expect(run.checked).toBe(6);
    expect(run.finishedAt).not.toBeNull();
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it('a completed run counts the ledger it read: user coupons, uses and their discount, refunded uses and theirs; two runs apart, the difference is what happened between', async () => {
    const before = await svc.runNow('FULL', 'test');
    expect(before.totals).not.toBeNull();
    const c = await coupon({ discount: { type: 'AMOUNT', thresholdCents: 0, amountCents: 700 }, returnOnRefund: true });
    const ucs = await Promise.all(['t1', 't2', 't3'].map((u) => grab(c, u)));
    const orders = [newKey('t-order'), newKey('t-order')];
    await redeem(ucs[0], 't1', orders[0]);
    await redeem(ucs[1], 't2', orders[1]);
    expect((await refund(ucs[1], orders[1])).status).toBe(201);
    const after = await svc.runNow('INCREMENTAL', 'test');
    const { userCoupons, redemptions, discountCents, refundedRedemptions, refundedDiscountCents } = after.totals!;
    const was = before.totals!;
    // Three grabbed and one returned by the refund; two uses of 7.00, one of them refunded.
    expect([
      userCoupons - was.userCoupons,
      redemptions - was.redemptions,
      discountCents - was.discountCents,
      refundedRedemptions - was.refundedRedemptions,
      refundedDiscountCents - was.refundedDiscountCents,
    ]).toEqual([4, 2, 1400, 1, 700]);
    // And the whole of it is what the tables hold.
    const held = await one<{ n: string; d: string }>(
      `SELECT COUNT(*) AS n, SUM(discount_cents) AS d FROM redemption WHERE status = 'USED'`,
    );
    expect([redemptions, discountCents]).toEqual([Number(held.n), Number(held.d)]);
    const shown = await request(t.url).get(`/admin/reconciliation/runs/${after.id}`).set(admin());
    expect(shown.body.totals).toEqual(after.totals);
    // A figure past 2^53 (a discount edited by hand to the column's limit) is no figure: the run still
    // completes, with no totals (writing it failed the run's end, every time).
    const use = await one<{ id: string }>(`SELECT id FROM redemption WHERE user_coupon_id = ?`, [ucs[0]]);
    await sql(`UPDATE redemption SET discount_cents = 18446744073709551615 WHERE id = ?`, [use.id]);
    const huge = await svc.runNow('FULL', 'test');
    expect([huge.status, huge.totals]).toEqual(['COMPLETED', null]);
    await settleAll();
    await sql(`UPDATE redemption SET discount_cents = 700 WHERE id = ?`, [use.id]);
  });

  it('finds each injected inconsistency exactly once with the right type and ids; approving the proposals leaves nothing to find', async () => {
    const [lostRow, lostStock, c] = [await coupon(), await coupon(), await coupon()];
    const [keep, deleted] = [await grab(lostRow, 'a1'), await grab(lostRow, 'a2')];
    await grab(lostStock, 'b1');
    const u = await Promise.all(['c1', 'c2', 'c3', 'c4', 'c5', 'c6'].map((user) => grab(c, user)));
    const red2 = await redeem(u[1], 'c2', 'ORDER-C2');
    const red3 = await redeem(u[2], 'c3');
    const red4 = await redeem(u[3], 'c4');
    const red6 = await redeem(u[5], 'c6');
    const [issuance6] = await sql(`SELECT id FROM user_coupon_state_log WHERE user_coupon_id = ? AND to_status = 'UNUSED'`, [u[5]]);

    // 1. an issued coupon's row deleted: its unit of stock has vanished
    await sql(`DELETE FROM user_coupon WHERE id = ?`, [deleted]);
    // 2. stock decremented twice without issuing
    await sql(`UPDATE coupon_stock SET stock = stock - 2 WHERE coupon_id = ?`, [lostStock]);
    // 3. a coupon set USED with no redemption (and no log row)
    await sql(`UPDATE user_coupon SET status = 'USED', used_at = NOW(3) WHERE id = ?`, [u[0]]);
    // 4. a redemption deleted
    await sql(`DELETE FROM redemption WHERE id = ?`, [red2]);
    // 5. a redeemed coupon's status set back to UNUSED
    await sql(`UPDATE user_coupon SET status = 'UNUSED', used_at = NULL WHERE id = ?`, [u[2]]);
    // 6. a redemption whose status change and its log row are both lost
    await sql(`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ? AND to_status = 'USED'`, [u[3]]);
    await sql(`UPDATE user_coupon SET status = 'UNUSED', used_at = NULL WHERE id = ?`, [u[3]]);
    // 7. the issuance log row of an unused coupon deleted
    await sql(`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ?`, [u[4]]);
    // 8. a log row altered: the use now reads as a void
    await sql(`UPDATE user_coupon_state_log SET to_status = 'VOID' WHERE user_coupon_id = ? AND to_status = 'USED'`, [u[5]]);
    expect((await checkInvariants(t.db)).length).toBeGreaterThan(0);

    const run = await svc.runNow('FULL', 'test');
    expect(run).toMatchObject({ status: 'COMPLETED', discrepancies: 8 });
    const found = await proposals(run.id);
    const summary = found
      .map((p) => [
        p.discrepancy.type,
        p.discrepancy.couponId,
        p.discrepancy.userCouponId,
        p.discrepancy.redemptionId,
        p.action,
        (p.params.steps ?? []).map((s) => s.op).join('+'),
      ])
      .sort((a, b) => String(a[2] ?? a[1]).localeCompare(String(b[2] ?? b[1])) || String(a[0]).localeCompare(String(b[0])));
    const expected = [
      ['STOCK_MISMATCH', lostRow, null, null, 'RESTORE_STOCK', ''],
      ['STOCK_MISMATCH', lostStock, null, null, 'RESTORE_STOCK', ''],
      ['USED_WITHOUT_REDEMPTION', c, u[0], null, 'MARK_CONSISTENT', 'SET_STATUS'],
      ['USED_WITHOUT_REDEMPTION', c, u[1], null, 'MARK_CONSISTENT', 'RECREATE_REDEMPTION'],
      ['REDEMPTION_WITHOUT_USED', c, u[2], red3, 'MARK_CONSISTENT', 'SET_STATUS'],
      ['REDEMPTION_WITHOUT_USED', c, u[3], red4, 'MARK_CONSISTENT', 'TRANSIT'],
      ['LOG_MISMATCH', c, u[4], null, 'MARK_CONSISTENT', 'APPEND_LOG'],
      ['LOG_MISMATCH', c, u[5], red6, 'MARK_CONSISTENT', 'REMOVE_LOG+APPEND_LOG'],
    ].sort((a, b) => String(a[2] ?? a[1]).localeCompare(String(b[2] ?? b[1])) || String(a[0]).localeCompare(String(b[0])));
    expect(summary).toEqual(expected);
    const byCoupon = (id: string) => found.find((p) => p.discrepancy.couponId === id && p.discrepancy.type === 'STOCK_MISMATCH')!;
    expect(byCoupon(lostRow).params).toMatchObject({ difference: 1, count: 1 });
    expect(byCoupon(lostStock).params).toMatchObject({ difference: 2, count: 2 });
    const altered = found.find((p) => p.discrepancy.userCouponId === u[5])!;
    expect(altered.discrepancy.details.lastConsistentLogId).toBe(issuance6.id);
    expect(found.find((p) => p.discrepancy.userCouponId === u[4])!.discrepancy.details.lastConsistentLogId).toBeNull();
    expect((await request(t.url).get(`/admin/reconciliation/runs/${run.id}`).set(admin())).body.byType).toEqual({
      STOCK_MISMATCH: 2,
      USED_WITHOUT_REDEMPTION: 2,
      REDEMPTION_WITHOUT_USED: 2,
      LOG_MISMATCH: 2,
    });

    // Still open: the next run does not report them again.
    expect(await svc.runNow('FULL', 'test')).toMatchObject({ status: 'COMPLETED', discrepancies: 0 });

    for (const p of found) {
      const res = await decide(p.id, 'approve');
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ id: p.id, status: 'DONE', decidedBy: 'admin-1', decisionReason: 'checked the order history' });
      expect(res.body.decidedAt).toEqual(expect.any(String));
    }
    expect(await checkInvariants(t.db)).toEqual([]);
    expect(await one<{ id: string }>(`SELECT id FROM user_coupon WHERE id = ?`, [keep])).toBeDefined();
    expect(await one(`SELECT status, used_at FROM user_coupon WHERE id = ?`, [u[0]])).toEqual({ status: 'UNUSED', used_at: null });
    expect(await one(`SELECT order_no, user_id, status FROM redemption WHERE user_coupon_id = ?`, [u[1]])).toEqual({
      order_no: 'ORDER-C2',
      user_id: 'c2',
      status: 'USED',
    });
    const history = await request(t.url).get(`/admin/user-coupons/${u[5]}/history`).set(admin());
    expect(history.body).toMatchObject({ consistent: true, replayedStatus: 'USED' });

    expect(await svc.runNow('FULL', 'test')).toMatchObject({ status: 'COMPLETED', discrepancies: 0 });
  });

  it("a lost redemption comes back with the discount its template's rule gave on the order, PERCENT too; with the order's row lost, the most the rule takes off without an amount", async () => {
    const rules: CouponInput['discount'][] = [
      { type: 'AMOUNT', thresholdCents: 0, amountCents: 500 },
      { type: 'PERCENT', thresholdCents: 1000, percentOff: 30, maxDiscountCents: 1000 },
      { type: 'PERCENT', thresholdCents: 0, percentOff: 30 },
    ];
    const cases = [];
    for (const [i, discount] of rules.entries()) {
      for (const orderLost of [false, true]) {
        const user = `lost-${i}-${orderLost}`;
        const uc = await grab(await coupon({ discount }), user);
        const orderNo = newKey('lost');
        const used = await request(t.url)
          .post('/redemptions')
          .set(bearer(serviceToken()))
          .send({ userCouponId: uc, orderNo, orderAmountCents: 4000, userId: user });
        expect(used.status).toBe(201);
        await sql(`DELETE FROM redemption WHERE user_coupon_id = ?`, [uc]);
        if (orderLost) await sql(`DELETE FROM coupon_order WHERE order_no = ?`, [orderNo]);
        cases.push({ uc, orderNo, granted: used.body.discountCents as number, orderLost });
      }
    }
    const found = await proposals((await svc.runNow('FULL', 'test')).id);
    for (const p of found) expect((await decide(p.id, 'approve')).status).toBe(200);
    const recorded = [];
    for (const c of cases) {
      const r = await one<{ a: string; d: string }>(
        `SELECT order_amount_cents AS a, discount_cents AS d FROM redemption WHERE user_coupon_id = ? AND status = 'USED'`,
        [c.uc],
      );
      recorded.push([Number(r.a), Number(r.d)]);
    }
    expect(cases.map((c) => c.granted)).toEqual([500, 500, 1000, 1000, 1200, 1200]);
    // Order known: its amount and the discount granted. Lost: the AMOUNT's amount, the PERCENT's cap
    // (on the smallest order 30 % of which reaches it), or nothing for an uncapped PERCENT.
    expect(recorded).toEqual([
      [4000, 500],
      [500, 500],
      [4000, 1000],
      [3334, 1000],
      [4000, 1200],
      [0, 0],
    ]);
    // The lost orders are named again, by the recreated redemptions: their rows come back with the amounts those recorded.
    const lostRows = cases.filter((c) => c.orderLost).map((c) => c.orderNo);
    const rows = await proposals((await svc.runNow('FULL', 'test')).id);
    expect(rows.map((p) => [p.discrepancy.type, p.action, p.params.orderNo]).sort()).toEqual(
      lostRows.map((orderNo) => ['ORDER_ROW_MISSING', 'RECREATE_ORDER', orderNo]).sort(),
    );
    for (const p of rows) expect((await decide(p.id, 'approve')).status).toBe(200);
    expect(
      await sql(`SELECT order_amount_cents AS a FROM coupon_order WHERE order_no IN (?) ORDER BY FIELD(order_no, ?)`, [lostRows, lostRows]),
    ).toEqual([{ a: '500' }, { a: '3334' }, { a: '0' }]);
    expect(await svc.runNow('FULL', 'test')).toMatchObject({ status: 'COMPLETED', discrepancies: 0 });
  });

  it('a lost redemption the order was refunded for comes back under its id: the refund answers for it, and no second refund is made', async () => {
    const { uc, orderNo, redemptionId, refunded: first } = await refundedUse('refunded-lost');
    await sql(`DELETE FROM redemption WHERE id = ?`, [redemptionId]);
    const run = await svc.runNow('FULL', 'test');
    const [proposal] = (await proposals(run.id)).filter((p) => p.discrepancy.userCouponId === uc);
    expect(proposal.discrepancy.type).toBe('USED_WITHOUT_REDEMPTION');
    const approved = await decide(proposal.id, 'approve');
    expect(approved.status).toBe(200);
    expect(approved.body.result.steps).toEqual(
      expect.arrayContaining([expect.objectContaining({ op: 'RECREATE_REDEMPTION', redemptionId, refunded: true })]),
    );
    expect(await one(`SELECT id, status FROM redemption WHERE user_coupon_id = ?`, [uc])).toEqual({ id: redemptionId, status: 'USED' });
    // Another refund number for the same use answers the first refund, as before the row was lost.
    const again = await refund(uc, orderNo);
    expect([again.status, again.headers['idempotent-replayed'], again.body.refundId]).toEqual([201, 'true', first.body.refundId]);
    expect(await one(`SELECT COUNT(*) AS n FROM refund WHERE user_coupon_id = ?`, [uc])).toEqual({ n: '1' });
    expect(await one(`SELECT COUNT(*) AS n FROM user_coupon WHERE replaces_user_coupon_id = ?`, [uc])).toEqual({ n: '1' });
  });

  it('a user above the per-user limit (a coupon row copied by hand) is reported for an operator, naming the user and the coupons', async () => {
    const c = await coupon({ perUserLimit: 1 });
    const uc = await grab(c, 'copied');
    await sql(
      `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, idempotency_key, issued_at, valid_from, expires_at, updated_at)
       SELECT coupon_id, user_id, status, source, 0, CONCAT(idempotency_key, '-copy'), issued_at, valid_from, expires_at, updated_at FROM user_coupon WHERE id = ?`,
      [uc],
    );
    const { copy } = await one<{ copy: string }>(`SELECT MAX(id) AS copy FROM user_coupon WHERE coupon_id = ?`, [c]);
    await sql(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
       SELECT ?, from_status, to_status, tx_id, reason, created_at FROM user_coupon_state_log WHERE user_coupon_id = ?`,
      [copy, uc],
    );
    const run = await svc.runNow('FULL', 'test');
    const found = (await proposals(run.id)).filter((p) => p.discrepancy.type === 'USER_LIMIT_EXCEEDED');
    expect(found.map((p) => [p.action, p.discrepancy.userCouponId, p.discrepancy.details])).toEqual([
      [
        'MANUAL_REVIEW',
        String(copy),
        expect.objectContaining({ couponId: c, userId: 'copied', perUserLimit: 1, held: 2, userCouponIds: [uc, String(copy)] }),
      ],
    ]);
    expect(found[0].discrepancy.details.explanation).toContain(`User copied holds 2 coupons of this template`);
    expect((await decide(found[0].id, 'approve')).status).toBe(200);
    // The operator's fix: the copy removed (it was never used); nothing is found then.
    await sql(`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ?`, [copy]);
    await sql(`DELETE FROM user_coupon WHERE id = ?`, [copy]);
    const after = await svc.runNow('FULL', 'test');
    expect((await proposals(after.id)).filter((p) => p.discrepancy.couponId === c)).toEqual([]);
  });

  it("a redemption edited by hand to take more off than its template's rule (its discount raised, or its amount lowered) is reported for an operator; a stacked coupon cut below its rule is not", async () => {
    const use = async (couponId: string, user: string, orderNo = newKey('rd'), orderAmountCents = 4000) => {
      const uc = await grab(couponId, user);
      const res = await request(t.url)
        .post('/redemptions')
        .set(bearer(serviceToken()))
        .send({ userCouponId: uc, orderNo, orderAmountCents, userId: user });
      expect(res.status).toBe(201);
      return { uc, id: res.body.redemptionId as string, discountCents: res.body.discountCents as number };
    };
    const raised = await use(await coupon({ discount: { type: 'AMOUNT', thresholdCents: 0, amountCents: 500 } }), 'rd-raised');
    const lowered = await use(
      await coupon({ discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 30, maxDiscountCents: 1000 } }),
      'rd-lowered',
    );
    const untouched = await use(await coupon({ discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 10 } }), 'rd-untouched');
    const uncapped = await use(await coupon({ discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 10 } }), 'rd-uncapped');
    const stackable = { stackable: true, discount: { type: 'AMOUNT' as const, thresholdCents: 0, amountCents: 3000 } };
    const order = newKey('rd-stacked');
    const stacked = [await use(await coupon(stackable), 'rd-stacked', order), await use(await coupon(stackable), 'rd-stacked', order)];
    expect([raised.discountCents, lowered.discountCents, untouched.discountCents, ...stacked.map((s) => s.discountCents)]).toEqual([
      500, 1000, 400, 3000, 1000,
    ]);
    // Repaired by an earlier version with the amount unknown: the cap as amount and discount alike. Not a finding.
    const oldRepair = await use(
      await coupon({ discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 30, maxDiscountCents: 1000 } }),
      'rd-old-repair',
    );
    await sql(`UPDATE redemption SET order_amount_cents = 1000 WHERE id = ?`, [oldRepair.id]);
    // An amount edited near the column's limit: a percent of it must not overflow and fail the run.
    const huge = await use(await coupon({ discount: { type: 'PERCENT', thresholdCents: 0, percentOff: 10 } }), 'rd-huge');
    await sql(`UPDATE redemption SET order_amount_cents = 18446744073709551615 WHERE id = ?`, [huge.id]);
    await sql(`UPDATE redemption SET discount_cents = 900 WHERE id IN (?)`, [[raised.id, uncapped.id]]);
    await sql(`UPDATE redemption SET order_amount_cents = 2000 WHERE id = ?`, [lowered.id]);

    const run = await svc.runNow('FULL', 'test');
    const found = (await proposals(run.id)).filter((p) => p.discrepancy.type === 'REDEMPTION_DISCOUNT_EXCEEDED');
    expect(found.map((p) => [p.action, p.discrepancy.redemptionId, p.discrepancy.userCouponId, p.discrepancy.details])).toEqual([
      [
        'MANUAL_REVIEW',
        raised.id,
        raised.uc,
        expect.objectContaining({ orderAmountCents: 4000, discountCents: 900, ruleDiscountCents: 500 }),
      ],
      [
        'MANUAL_REVIEW',
        lowered.id,
        lowered.uc,
        expect.objectContaining({ orderAmountCents: 2000, discountCents: 1000, ruleDiscountCents: 600 }),
      ],
      [
        'MANUAL_REVIEW',
        uncapped.id,
        uncapped.uc,
        expect.objectContaining({ orderAmountCents: 4000, discountCents: 900, ruleDiscountCents: 400 }),
      ],
    ]);
    expect(found[0].discrepancy.details.explanation).toMatch(
      /^Used on order rd-\S+, it took ¥9 off an order of ¥40, where its template's rule takes ¥5 off: an operator decides\.$/,
    );
    for (const p of found) expect((await decide(p.id, 'approve')).status).toBe(200);
    // Still there, so found again; once the operator puts the amounts back, nothing is.
    expect(
      (await proposals((await svc.runNow('FULL', 'test')).id)).filter((p) => p.discrepancy.type === 'REDEMPTION_DISCOUNT_EXCEEDED'),
    ).toHaveLength(3);
    await settleAll();
    await sql(`UPDATE redemption SET discount_cents = 500 WHERE id = ?`, [raised.id]);
    await sql(`UPDATE redemption SET discount_cents = 400 WHERE id = ?`, [uncapped.id]);
    await sql(`UPDATE redemption SET order_amount_cents = 4000 WHERE id IN (?)`, [[lowered.id, huge.id]]);
    expect(await svc.runNow('FULL', 'test')).toMatchObject({ status: 'COMPLETED', discrepancies: 0 });
  });

  it('a refund naming a redemption recreated under a new id (by an earlier repair) is made to name it again: no second refund', async () => {
    const { c, uc, orderNo, redemptionId, refunded: first } = await refundedUse('repointed');
    const recreated = await moveRedemption(redemptionId);
    const run = await svc.runNow('FULL', 'test');
    const found = (await proposals(run.id)).filter((p) => p.discrepancy.type === 'REFUND_REDEMPTION_MISSING');
    expect(found.map((p) => [p.action, p.discrepancy.userCouponId, p.discrepancy.redemptionId])).toEqual([
      ['REPOINT_REFUND', uc, recreated],
    ]);
    expect((await decide(found[0].id, 'approve')).status).toBe(200);
    expect(await one(`SELECT redemption_id AS id FROM refund WHERE id = ?`, [first.body.refundId])).toEqual({ id: recreated });
    const again = await refund(uc, orderNo);
    expect([again.status, again.headers['idempotent-replayed'], again.body.refundId]).toEqual([201, 'true', first.body.refundId]);
    expect(await checkInvariants(t.db, { couponIds: [c] })).toEqual([]);
    const after = await svc.runNow('FULL', 'test');
    expect((await proposals(after.id)).filter((p) => p.discrepancy.couponId === c)).toEqual([]);
  });

  it("a refund's returned coupon whose row is gone is found, and approving returns the coupon again, named by the refund", async () => {
    const { c, uc, orderNo, refunded } = await refundedUse('lost-return');
    const lost = String(refunded.body.replacementUserCoupon.id);
    await sql(`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ?`, [lost]);
    await sql(`DELETE FROM user_coupon WHERE id = ?`, [lost]);
    const run = await svc.runNow('FULL', 'test');
    const [found] = (await proposals(run.id)).filter((p) => p.discrepancy.type === 'REFUND_REPLACEMENT_MISSING');
    expect([found.action, found.discrepancy.userCouponId, found.discrepancy.details]).toEqual([
      'REISSUE_REPLACEMENT',
      uc,
      expect.objectContaining({ refundId: refunded.body.refundId, orderNo, userId: 'lost-return', missingUserCouponId: lost }),
    ]);
    const approved = await decide(found.id, 'approve');
    expect(approved.status).toBe(200);
    const again = String(approved.body.result.replacementUserCouponId);
    expect(await one(`SELECT user_id, status, source, from_stock, replaces_user_coupon_id FROM user_coupon WHERE id = ?`, [again])).toEqual(
      {
        user_id: 'lost-return',
        status: 'UNUSED',
        source: 'REFUND_RETURN',
        from_stock: 0,
        replaces_user_coupon_id: uc,
      },
    );
    expect(await one(`SELECT replacement_user_coupon_id AS id FROM refund WHERE id = ?`, [refunded.body.refundId])).toEqual({ id: again });
    expect(await checkInvariants(t.db, { couponIds: [c] })).toEqual([]);
    const after = await svc.runNow('FULL', 'test');
    expect((await proposals(after.id)).filter((p) => p.discrepancy.couponId === c)).toEqual([]);
    expect((await decide(found.id, 'approve')).status).toBe(409);
  });

  it('a refund whose redemption was recreated and whose returned coupon is gone gets both findings in one run, each repaired on approval', async () => {
    const { c, redemptionId, refunded } = await refundedUse('both-lost');
    const recreated = await moveRedemption(redemptionId);
    const returned = String(refunded.body.replacementUserCoupon.id);
    await sql(`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ?`, [returned]);
    await sql(`DELETE FROM user_coupon WHERE id = ?`, [returned]);
    const found = (await proposals((await svc.runNow('FULL', 'test')).id)).filter((p) => p.discrepancy.couponId === c);
    expect(found.map((p) => [p.discrepancy.type, p.action]).sort()).toEqual([
      ['REFUND_REDEMPTION_MISSING', 'REPOINT_REFUND'],
      ['REFUND_REPLACEMENT_MISSING', 'REISSUE_REPLACEMENT'],
    ]);
    for (const p of found) expect((await decide(p.id, 'approve')).status).toBe(200);
    expect(
      await one(`SELECT redemption_id, replacement_user_coupon_id IS NOT NULL AS returned FROM refund WHERE id = ?`, [
        refunded.body.refundId,
      ]),
    ).toEqual({
      redemption_id: recreated,
      returned: 1,
    });
    expect(await checkInvariants(t.db, { couponIds: [c] })).toEqual([]);
    expect((await proposals((await svc.runNow('FULL', 'test')).id)).filter((p) => p.discrepancy.couponId === c)).toEqual([]);
  });

  it('a lost returned coupon that had been used is left to an operator: another would give the user a second use', async () => {
    const { uc, refunded } = await refundedUse('used-return');
    const returned = String(refunded.body.replacementUserCoupon.id);
    const usedOn = await redeem(returned, 'used-return');
    // The used coupon's row is deleted by hand; its log and its redemption stay.
    await sql(`DELETE FROM user_coupon WHERE id = ?`, [returned]);
    const run = await svc.runNow('FULL', 'test');
    const found = (await proposals(run.id)).filter((p) => p.discrepancy.type === 'REFUND_REPLACEMENT_MISSING');
    expect(found.map((p) => [p.action, p.discrepancy.userCouponId, p.discrepancy.details.explanation])).toEqual([
      ['MANUAL_REVIEW', uc, expect.stringContaining('an operator decides')],
    ]);
    expect((await decide(found[0].id, 'approve')).status).toBe(200);
    expect(await one(`SELECT COUNT(*) AS n FROM user_coupon WHERE replaces_user_coupon_id = ?`, [uc])).toEqual({ n: '0' });
    // Put back as it was, so that the file's other runs see a consistent database.
    await sql(
      `INSERT INTO user_coupon (id, coupon_id, user_id, status, source, from_stock, replaces_user_coupon_id, reason, issued_at, valid_from, expires_at, used_at, updated_at)
       SELECT ?, coupon_id, user_id, 'USED', 'REFUND_RETURN', 0, id, 'restored', issued_at, valid_from, expires_at, NOW(3), NOW(3) FROM user_coupon WHERE id = ?`,
      [returned, uc],
    );
    expect(usedOn).toBeTruthy();
  });

  it("a lost stacked redemption comes back cut to what the order's other coupons left of it, the order's row lost or not", async () => {
    const recorded = [];
    for (const orderLost of [false, true]) {
      const user = `stack-${orderLost}`;
      const a = await grab(await coupon({ stackable: true, discount: { thresholdCents: 0, amountCents: 800 } }), user);
      const b = await grab(await coupon({ stackable: true, discount: { thresholdCents: 0, amountCents: 500 } }), user);
      const orderNo = newKey('stack');
      const use = (userCouponId: string) =>
        request(t.url)
          .post('/redemptions')
          .set(bearer(serviceToken()))
          .send({ userCouponId, orderNo, orderAmountCents: 1000, userId: user });
      expect((await use(a)).body.discountCents).toBe(800);
      expect((await use(b)).body.discountCents).toBe(200);
      await sql(`DELETE FROM redemption WHERE user_coupon_id = ?`, [b]);
      if (orderLost) await sql(`DELETE FROM coupon_order WHERE order_no = ?`, [orderNo]);
      const found = await proposals((await svc.runNow('FULL', 'test')).id);
      for (const p of found) expect((await decide(p.id, 'approve')).status).toBe(200);
      const r = await one<{ a: string; d: string }>(
        `SELECT order_amount_cents AS a, discount_cents AS d FROM redemption WHERE user_coupon_id = ? AND status = 'USED'`,
        [b],
      );
      recorded.push([Number(r.a), Number(r.d)]);
    }
    expect(recorded).toEqual([
      [1000, 200],
      [1000, 200],
    ]);
    expect(await svc.runNow('FULL', 'test')).toMatchObject({ status: 'COMPLETED', discrepancies: 0 });
  });

  it('a run that read a coupon before an approval repaired it does not report the repaired damage again', async () => {
    const c = await coupon();
    const ucs = [await grab(c, 'rr1'), await grab(c, 'rr2')];
    for (const uc of ucs) await sql(`UPDATE user_coupon SET status = 'USED', used_at = NOW(3) WHERE id = ?`, [uc]);
    const [first, second] = await proposals((await svc.runNow('FULL', 'test')).id);
    // The next run reads its chunk, then both proposals are decided before it records what it read: one approved, one rejected.
    const audits = t.app.get(AuditService);
    const read = audits.userCouponChunk.bind(audits);
    const spy = jest.spyOn(audits, 'userCouponChunk').mockImplementationOnce(async (...args) => {
      const chunk = await read(...args);
      expect((await decide(first.id, 'approve')).status).toBe(200);
      expect((await decide(second.id, 'reject')).status).toBe(200);
      return chunk;
    });
    try {
      const run = await svc.runNow('FULL', 'test');
      // The rejected one changed nothing: its damage is reported again; the approved one's is gone.
      expect((await proposals(run.id)).map((p) => p.discrepancy.userCouponId)).toEqual([second.discrepancy.userCouponId]);
      expect(spy).toHaveBeenCalled();
    } finally {
      spy.mockRestore();
    }
    await settleAll();
  });

  it('deciding twice is 409, an unknown id 404, a stale proposal 409 with nothing changed; a rejection changes no data', async () => {
    const c = await coupon();
    await grab(c, 'd1');
    await sql(`UPDATE coupon_stock SET stock = stock + 1 WHERE coupon_id = ?`, [c]);
    const run = await svc.runNow('FULL', 'test');
    const [p] = await proposals(run.id);
    expect(p).toMatchObject({
      action: 'REMOVE_STOCK',
      params: { difference: -1, count: 1 },
      discrepancy: { type: 'STOCK_MISMATCH', couponId: c },
    });

    // Someone fixed it by hand meanwhile: the proposal no longer fits and must not apply.
    await sql(`UPDATE coupon_stock SET stock = stock - 1 WHERE coupon_id = ?`, [c]);
    const stale = await decide(p.id, 'approve');
    expect([stale.status, stale.body.code]).toEqual([409, 'STATUS_CONFLICT']);
    expect(await one(`SELECT stock FROM coupon_stock WHERE coupon_id = ?`, [c])).toEqual({ stock: '19' });
    expect((await proposals(run.id)).map((x) => x.id)).toEqual([p.id]);

    const rejected = await decide(p.id, 'reject', 'fixed by hand');
    expect(rejected.status).toBe(200);
    expect(rejected.body).toMatchObject({ status: 'REJECTED', decisionReason: 'fixed by hand', discrepancy: { open: false } });
    expect(await one(`SELECT stock FROM coupon_stock WHERE coupon_id = ?`, [c])).toEqual({ stock: '19' });

    const again = await decide(p.id, 'approve');
    expect([again.status, again.body.code, again.body.details.status]).toEqual([409, 'COMPENSATION_ALREADY_DECIDED', 'REJECTED']);
    const missing = await decide('987654321', 'approve');
    expect([missing.status, missing.body.code]).toEqual([404, 'COMPENSATION_NOT_FOUND']);
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it('a page of PENDING proposals is one moment: one decided while the page is read neither goes missing nor ends the paging early', async () => {
    const coupons = [await coupon(), await coupon(), await coupon()];
    for (const c of coupons) await sql(`UPDATE coupon_stock SET stock = stock + 1 WHERE coupon_id = ?`, [c]);
    const run = await svc.runNow('FULL', 'test');
    const ids = (await proposals(run.id)).map((p) => p.id);
    expect(ids).toHaveLength(3);
    // TypeORM reads a joined page's ids first, then their rows: the first is decided in between.
    let idsRead = false;
    const between = interleaveBefore(
      t.app.get(DataSource),
      (q) => {
        if (q.includes('DISTINCT') && q.includes('compensation')) idsRead = true;
        else return idsRead && q.includes('compensation');
        return false;
      },
      () => sql(`UPDATE compensation SET status = 'REJECTED' WHERE id = ?`, [ids[0]]),
    );
    let page: { items: CompensationBody[]; nextCursor: string | null };
    try {
      page = (await request(t.url).get(`/admin/compensations?status=PENDING&runId=${run.id}&limit=2`).set(admin())).body;
    } finally {
      between.restore();
    }
    expect(between.ran).toBe(1);
    expect([page.items.map((p) => p.id), page.nextCursor]).toEqual([[ids[0], ids[1]], ids[1]]);
    await sql(`UPDATE compensation SET status = 'PENDING' WHERE id = ?`, [ids[0]]);
    for (const id of ids) expect((await decide(id, 'approve')).status).toBe(200);
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it('approves REMOVE_STOCK, and two concurrent approvals of one proposal: one 200, one 409', async () => {
    const c = await coupon();
    await sql(`UPDATE coupon_stock SET stock = stock + 3 WHERE coupon_id = ?`, [c]);
    const [p] = await proposals((await svc.runNow('FULL', 'test')).id);
    const answers = await Promise.all([decide(p.id, 'approve'), decide(p.id, 'approve')]);
    expect(answers.map((r) => r.status).sort()).toEqual([200, 409]);
    expect(await one(`SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, [c])).toEqual({ init_stock: '20', stock: '20' });
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it('an excess of stock grabbed before anyone looked is proposed ADOPT_ISSUED, which approved ends the sale at what was issued', async () => {
    const c = await coupon({ totalStock: 5 });
    await sql(`UPDATE coupon_stock SET stock = stock + 3 WHERE coupon_id = ?`, [c]);
    for (let i = 0; i < 8; i++) await grab(c, `excess-${i}`);
    const [p] = await proposals((await svc.runNow('FULL', 'test')).id);
    expect(p).toMatchObject({ action: 'ADOPT_ISSUED', params: { initStock: 5, stock: 0, issuedFromStock: 8, difference: -3 } });
    // Stock an admin added since would be lost by ending the sale: the proposal no longer fits.
    await request(t.url).post(`/admin/coupons/${c}/stock`).set(admin()).send({ delta: 10 });
    const stale = await decide(p.id, 'approve');
    expect([stale.status, stale.body.code]).toEqual([409, 'STATUS_CONFLICT']);
    await request(t.url).post(`/admin/coupons/${c}/stock`).set(admin()).send({ delta: -10 });
    const approved = await decide(p.id, 'approve');
    expect([approved.status, approved.body.result]).toEqual([200, { done: 'ADOPT_ISSUED', couponId: c, initStock: 8, stock: 0 }]);
    expect(await one(`SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, [c])).toEqual({ init_stock: '8', stock: '0' });
    expect(await proposals((await svc.runNow('FULL', 'test')).id)).toEqual([]);
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it('six triggers at once give one run: one 202, five 409 RECONCILIATION_RUNNING naming it', async () => {
    const c = await coupon();
    await Promise.all(['e1', 'e2', 'e3'].map((user) => grab(c, user)));
    const answers = await Promise.all([0, 1, 2, 3, 4, 5].map(() => request(t.url).post('/admin/reconciliation/runs').set(admin())));
    expect(answers.map((r) => r.status).sort()).toEqual([202, 409, 409, 409, 409, 409]);
    const accepted = answers.find((r) => r.status === 202)!.body;
    expect(accepted).toEqual({ runId: expect.stringMatching(/^[0-9]+$/) });
    // Even a trigger refused between the lease and the run's row names the run.
    for (const refused of answers.filter((r) => r.status === 409))
      expect(refused.body).toMatchObject({ code: 'RECONCILIATION_RUNNING', details: { runId: accepted.runId } });
    const run = await waitForRun(accepted.runId);
    expect(run).toMatchObject({ id: accepted.runId, status: 'COMPLETED', mode: 'FULL', triggeredBy: 'admin-1' });
  });

  async function waitForRun(runId: string) {
    for (let i = 0; i < 200; i++) {
      const res = await request(t.url).get(`/admin/reconciliation/runs/${runId}`).set(admin());
      if (res.body.status !== 'RUNNING') return res.body;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`run ${runId} did not finish`);
  }

  it('a run whose end meets a database blip records it once the database answers, holding the lease till then', async () => {
    const txs = t.app.get(TransactionService);
    const inTransaction = txs.inTransaction.bind(txs);
    let away = true;
    let failures = 0;
    // The blip: the run's end, and its retries, lose their connection until the trigger below is answered.
    const blip = jest.spyOn(txs, 'inTransaction').mockImplementation(((fn: (em: EntityManager) => Promise<unknown>) =>
      inTransaction((em) =>
        fn(
          new Proxy(em, {
            get: (target, prop) =>
              prop === 'query'
                ? (q: string, params?: unknown[]) => {
                    if (q.startsWith('UPDATE reconciliation_run SET status = ?, finished_at') && away) {
                      failures++;
                      return Promise.reject(Object.assign(new Error('Connection lost'), { code: 'PROTOCOL_CONNECTION_LOST' }));
                    }
                    return target.query(q, params);
                  }
                : Reflect.get(target, prop, target),
          }),
        ),
      )) as typeof txs.inTransaction);
    try {
      const first = await request(t.url).post('/admin/reconciliation/runs').set(admin());
      expect(first.status).toBe(202);
      for (let i = 0; i < 500 && failures === 0; i++) await new Promise((r) => setTimeout(r, 20));
      // Its end not yet written: a trigger is refused naming it.
      const during = await request(t.url).post('/admin/reconciliation/runs').set(admin());
      away = false;
      expect([during.status, during.body.details?.runId]).toEqual([409, first.body.runId]);
      expect(await waitForRun(first.body.runId)).toMatchObject({ status: 'COMPLETED', finishedAt: expect.any(String) });
      expect(failures).toBeGreaterThan(0);
    } finally {
      blip.mockRestore();
    }
    // The lease goes with the end (a round trip or two after it): the next trigger starts a run.
    let next = await request(t.url).post('/admin/reconciliation/runs').set(admin());
    for (let i = 0; i < 20 && next.status === 409; i++) {
      await new Promise((r) => setTimeout(r, 50));
      next = await request(t.url).post('/admin/reconciliation/runs').set(admin());
    }
    expect(next.status).toBe(202);
    await waitForRun(next.body.runId);
  });

  it('a trigger refused by a run that ended before the refusal could read it still names that run', async () => {
    const other = await tryAcquireLease(t.db, RECONCILIATION_LEASE, { ttlMs: 60_000, retries: 2 });
    expect(other).not.toBeNull();
    try {
      // The holder's run ends once the refused trigger is looking for its row.
      const looking = new Promise<void>((resolve) => {
        const ds = t.app.get(DataSource);
        const query = ds.query.bind(ds);
        jest.spyOn(ds, 'query').mockImplementation(async (...args: Parameters<DataSource['query']>) => {
          if (args[0].includes('FROM reconciliation_run WHERE status = ')) resolve();
          return query(...args);
        });
      });
      const answer = request(t.url)
        .post('/admin/reconciliation/runs')
        .set(admin())
        .then((r) => r);
      await looking;
      jest.restoreAllMocks();
      const ended = await sql(
        `INSERT INTO reconciliation_run (status, mode, triggered_by, started_at, finished_at) VALUES ('COMPLETED', 'FULL', 'other', NOW(3), NOW(3))`,
      );
      const busy = await answer;
      expect([busy.status, busy.body.code, busy.body.details]).toEqual([409, 'RECONCILIATION_RUNNING', { runId: String(ended.insertId) }]);
    } finally {
      await other?.release();
    }
  });

  it('a trigger refused by a run that wrote its end just before the try, its lease not yet released, names that run', async () => {
    const other = await tryAcquireLease(t.db, RECONCILIATION_LEASE, { ttlMs: 60_000, retries: 2 });
    expect(other).not.toBeNull();
    try {
      const ended = await sql(
        `INSERT INTO reconciliation_run (status, mode, triggered_by, started_at, finished_at) VALUES ('COMPLETED', 'FULL', 'other', NOW(3) - INTERVAL 0.3 SECOND, NOW(3) - INTERVAL 0.2 SECOND)`,
      );
      const busy = await request(t.url).post('/admin/reconciliation/runs').set(admin());
      expect([busy.status, busy.body.code, busy.body.details]).toEqual([409, 'RECONCILIATION_RUNNING', { runId: String(ended.insertId) }]);
    } finally {
      await other?.release();
    }
  });

  it('a run holding the lease from another instance makes a trigger 409; a dead RUNNING run is marked FAILED by the next start', async () => {
    const other = await tryAcquireLease(t.db, RECONCILIATION_LEASE, { ttlMs: 60_000, retries: 2 });
    expect(other).not.toBeNull();
    try {
      const busy = await request(t.url).post('/admin/reconciliation/runs').set(admin()).send({ mode: 'FULL' });
      expect([busy.status, busy.body.code]).toEqual([409, 'RECONCILIATION_RUNNING']);
    } finally {
      await other?.release();
    }
    const dead = await sql(
      `INSERT INTO reconciliation_run (status, mode, triggered_by, started_at) VALUES ('RUNNING', 'FULL', 'crashed', NOW(3))`,
    );
    const run = await svc.runNow('FULL', 'test');
    expect(run.status).toBe('COMPLETED');
    const corpse = await request(t.url).get(`/admin/reconciliation/runs/${dead.insertId}`).set(admin());
    expect(corpse.body).toMatchObject({ status: 'FAILED', finishedAt: expect.any(String), error: expect.stringMatching(/^Died/) });
    const list = await request(t.url).get('/admin/reconciliation/runs?limit=2').set(admin());
    expect(list.body.items.map((r: { id: string }) => r.id)).toEqual([run.id, String(dead.insertId)]);
    expect(list.body.nextCursor).toBe(String(dead.insertId));
  });

  it('INCREMENTAL sees a status changed by hand (the database moves updated_at), and reports a rejected discrepancy again', async () => {
    const c = await coupon();
    const uc = await grab(c, 'hand');
    const dayOld = () => sql(`UPDATE user_coupon SET updated_at = NOW(3) - INTERVAL 1 DAY WHERE id = ?`, [uc]);
    await dayOld();
    await svc.runNow('FULL', 'test');
    await sql(`UPDATE user_coupon SET status = 'VOID' WHERE id = ?`, [uc]);
    const inc = await svc.runNow('INCREMENTAL', 'test');
    const [found] = await proposals(inc.id);
    expect([inc.mode, found?.discrepancy.type, found?.discrepancy.userCouponId]).toEqual(['INCREMENTAL', 'LOG_MISMATCH', uc]);
    expect((await decide(found.id, 'reject')).status).toBe(200);
    await dayOld();
    const again = await svc.runNow('INCREMENTAL', 'test');
    expect((await proposals(again.id)).map((p) => [p.discrepancy.type, p.discrepancy.userCouponId])).toEqual([['LOG_MISMATCH', uc]]);
    await settleAll();
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it("INCREMENTAL looks back as far as the server's zone is behind UTC (a hand edit stamps updated_at in it), 12 hours for a zone it cannot tell", async () => {
    const hour = 3600_000;
    expect(await zoneBehindUtcMs(t.db, '-05:00')).toBe(5 * hour);
    expect(await zoneBehindUtcMs(t.db, '-09:30')).toBe(9.5 * hour);
    expect(await zoneBehindUtcMs(t.db, '+08:00')).toBe(0);
    expect(await zoneBehindUtcMs(t.db, 'Mars/Olympus_Mons')).toBe(12 * hour);
  });

  it('INCREMENTAL replays the log only of coupons changed since the last complete run; FULL replays all', async () => {
    const c = await coupon();
    const [old, fresh] = [await grab(c, 'f1'), await grab(c, 'f2')];
    await sql(`UPDATE user_coupon SET updated_at = NOW(3) - INTERVAL 1 DAY WHERE id = ?`, [old]);
    await svc.runNow('FULL', 'test');
    // A log row altered behind the service's back leaves updated_at alone: only a full run sees it.
    await sql(`UPDATE user_coupon_state_log SET to_status = 'EXPIRED' WHERE user_coupon_id = ?`, [old]);
    await sql(`UPDATE user_coupon SET status = 'VOID', updated_at = NOW(3) WHERE id = ?`, [fresh]);
    const inc = await svc.runNow('INCREMENTAL', 'test');
    expect(inc).toMatchObject({ mode: 'INCREMENTAL', discrepancies: 1 });
    expect((await proposals(inc.id)).map((p) => [p.discrepancy.type, p.discrepancy.userCouponId])).toEqual([['LOG_MISMATCH', fresh]]);
    const full = await svc.runNow('FULL', 'test');
    expect((await proposals(full.id)).map((p) => [p.discrepancy.type, p.discrepancy.userCouponId])).toEqual([['LOG_MISMATCH', old]]);
    await settleAll();
    expect(await checkInvariants(t.db)).toEqual([]);
  });

  it('a coupon whose stock row is gone is found and its row recreated sold out on approval; until then a stock change is 404, not INSUFFICIENT_STOCK', async () => {
    const c = await coupon({ totalStock: 5 });
    await grab(c, 'ns1');
    await grab(c, 'ns2');
    await sql(`DELETE FROM coupon_stock WHERE coupon_id = ?`, [c]);
    const add = () => request(t.url).post(`/admin/coupons/${c}/stock`).set(admin()).send({ delta: 3 });
    const refused = await add();
    expect([refused.status, refused.body.code]).toEqual([404, 'COUPON_NOT_FOUND']);
    const run = await svc.runNow('FULL', 'test');
    const found = await proposals(run.id);
    expect(found.map((p) => [p.discrepancy.type, p.discrepancy.couponId, p.action])).toEqual([['STOCK_MISMATCH', c, 'RECREATE_STOCK']]);
    expect((await decide(found[0].id, 'approve')).body.result).toEqual({ done: 'RECREATE_STOCK', couponId: c, initStock: 2, stock: 0 });
    expect(await one(`SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, [c])).toEqual({ init_stock: '2', stock: '0' });
    const added = await add();
    expect([added.status, added.body.initStock, added.body.remainingStock]).toEqual([200, 5, 3]);
    expect(await proposals((await svc.runNow('FULL', 'test')).id)).toEqual([]);
  });

  it('a redemption whose user coupon row is gone is reported for manual review, next to the stock its coupon lost', async () => {
    const c = await coupon();
    const uc = await grab(c, 'g1');
    const red = await redeem(uc, 'g1');
    await sql(`DELETE FROM user_coupon WHERE id = ?`, [uc]);
    const run = await svc.runNow('FULL', 'test');
    const found = (await proposals(run.id)).map((p) => [
      p.discrepancy.type,
      p.discrepancy.couponId,
      p.discrepancy.userCouponId,
      p.discrepancy.redemptionId,
      p.action,
    ]);
    expect(found).toEqual([
      ['STOCK_MISMATCH', c, null, null, 'RESTORE_STOCK'],
      ['REDEMPTION_WITHOUT_USED', null, uc, red, 'MANUAL_REVIEW'],
    ]);
    await settleAll();
    // Approving a manual review changes nothing, so the next run reports the orphan again.
    const next = await svc.runNow('FULL', 'test');
    expect((await proposals(next.id)).map((p) => p.discrepancy.type)).toEqual(['REDEMPTION_WITHOUT_USED']);
    await sql(`DELETE FROM redemption WHERE id = ?`, [red]);
    await settleAll();
  });

  it('a redemption naming a user coupon id past the table is found, just past its last id or chunks away', async () => {
    await settleAll();
    const uc = await grab(await coupon(), 'past1');
    const red = await redeem(uc, 'past1');
    const [{ hi }] = (await sql(`SELECT MAX(id) AS hi FROM user_coupon`)) as { hi: string }[];
    // Just past the last id (inside the last user-coupon chunk's ids), and past every chunk (the redemptions' own pass).
    const past = [String(BigInt(hi) + 1n), String(BigInt(hi) + 20_000n)];
    const copies: string[] = [];
    for (const id of past) {
      const res = (await sql(
        `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at)
         SELECT ?, order_no, user_id, order_amount_cents, 0, status, used_at FROM redemption WHERE id = ?`,
        [id, red],
      )) as { insertId: number };
      copies.push(String(res.insertId));
    }
    try {
      const run = await svc.runNow('FULL', 'test');
      const found = (await proposals(run.id)).map((p) => [p.discrepancy.type, p.discrepancy.userCouponId, p.discrepancy.redemptionId]);
      expect(found).toEqual([
        ['REDEMPTION_WITHOUT_USED', past[0], copies[0]],
        ['REDEMPTION_WITHOUT_USED', past[1], copies[1]],
      ]);
      expect(run.discrepancies).toBe(2);
    } finally {
      await sql(`DELETE FROM redemption WHERE id IN (?)`, [copies]);
    }
    await settleAll();
  });

  it('reads the user-coupon chunks several at once and finds the faults of every chunk, as one at a time does', async () => {
    await settleAll();
    const c = await coupon();
    const template = await grab(c, 'chunks-0');
    // 12,000 more, copies of a real one (stock-neutral, each with its issue log row): three chunks of 5,000.
    await sql(
      `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, idempotency_key, issued_at, valid_from, expires_at, updated_at)
       SELECT coupon_id, CONCAT('chunks-', s.seq), status, 'BULK', 0, NULL, issued_at, valid_from, expires_at, updated_at
       FROM user_coupon, seq_1_to_12000 s WHERE id = ?`,
      [template],
    );
    await sql(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
       SELECT uc.id, NULL, 'UNUSED', CONCAT('test:', uc.id), NULL, uc.issued_at FROM user_coupon uc WHERE uc.coupon_id = ? AND uc.id <> ?`,
      [c, template],
    );
    const ids = ((await sql(`SELECT id FROM user_coupon WHERE coupon_id = ? ORDER BY id`, [c])) as { id: string }[]).map((r) => r.id);
    const broken = [ids[1], ids[6000], ids[ids.length - 1]];
    await sql(`UPDATE user_coupon SET status = 'USED', used_at = NOW(3) WHERE id IN (?)`, [broken]);

    const config = t.app.get(AppConfig);
    config.RECONCILE_CONCURRENCY = 3;
    const parallel = await svc.runNow('FULL', 'test');
    const found = (await proposals(parallel.id))
      .filter((p) => p.discrepancy.type === 'USED_WITHOUT_REDEMPTION')
      .map((p) => p.discrepancy.userCouponId);
    expect([...found].sort()).toEqual([...broken].sort());
    config.RECONCILE_CONCURRENCY = 1;
    const serial = await svc.runNow('FULL', 'test');
    expect([serial.status, serial.checked]).toEqual(['COMPLETED', parallel.checked]);
    expect(parallel.checked).toBeGreaterThan(12_000);
    await settleAll();
  });

  it('validates input and lets only admins in', async () => {
    const user = bearer(tokenFor('someone'));
    for (const [method, path] of [
      ['post', '/admin/reconciliation/runs'],
      ['get', '/admin/reconciliation/runs'],
      ['get', '/admin/reconciliation/runs/1'],
      ['get', '/admin/compensations'],
      ['post', '/admin/compensations/1/approve'],
      ['post', '/admin/compensations/1/reject'],
    ] as const) {
      const res =
        method === 'post' ? await request(t.url).post(path).set(user).send({ reason: 'x' }) : await request(t.url).get(path).set(user);
      expect([path, res.status, res.body.code]).toEqual([path, 403, 'FORBIDDEN']);
      expect((await request(t.url)[method](path)).status).toBe(401);
    }
    const bad = async (res: request.Response) => expect([res.status, res.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    await bad(await request(t.url).post('/admin/reconciliation/runs').set(admin()).send({ mode: 'SOMETIMES' }));
    await bad(await request(t.url).post('/admin/reconciliation/runs').set(admin()).send({ mode: 'FULL', extra: 1 }));
    await bad(await request(t.url).post('/admin/reconciliation/runs').set(admin()).send([1]));
    // A JSON null is a body that is not an object, as on every other route; only an absent body means the defaults.
    const nullBody = await request(t.url)
      .post('/admin/reconciliation/runs')
      .set(admin())
      .set('Content-Type', 'application/json')
      .send('null');
    expect([nullBody.status, nullBody.body.code, nullBody.body.details?.fields]).toEqual([
      400,
      'VALIDATION_FAILED',
      { body: ['must be a JSON object'] },
    ]);
    await bad(await request(t.url).get('/admin/compensations?status=MAYBE').set(admin()));
    await bad(await request(t.url).get('/admin/compensations?limit=0').set(admin()));
    await bad(await request(t.url).get('/admin/compensations?runId=abc').set(admin()));
    await bad(await request(t.url).get('/admin/reconciliation/runs/abc').set(admin()));
    await bad(await request(t.url).post('/admin/compensations/1/approve').set(admin()).send({}));
    await bad(await request(t.url).post('/admin/compensations/1/reject').set(admin()).send({ reason: '' }));
    await bad(await request(t.url).post('/admin/compensations/1/reject').set(admin()).send({ reason: '   ' }));
    await bad(await request(t.url).post('/admin/compensations/1/approve').set(admin()).send({ reason: 'ok\u0000' }));
    await bad(
      await request(t.url)
        .post('/admin/compensations/1/reject')
        .set(admin())
        .send({ reason: 'x'.repeat(501) }),
    );
    const missing = await request(t.url).get('/admin/reconciliation/runs/987654321').set(admin());
    expect([missing.status, missing.body.code]).toEqual([404, 'RUN_NOT_FOUND']);
    const metrics = await request(t.url).get('/metrics');
    expect(metrics.text).toMatch(/reconciliation_runs_total\{status="COMPLETED",mode="FULL"\} [1-9]/);
    expect(metrics.text).toMatch(/reconciliation_run_checked_rows\{audit="user_coupon"\} [1-9]/);
  });

  it('the cron runs once per tick across instances: a tick that fires after the run of the same tick has finished skips', async () => {
    const due = new Date(Date.now() - 1);
    const cronRuns = async () =>
      Number((await one<{ n: string }>(`SELECT COUNT(*) AS n FROM reconciliation_run WHERE triggered_by = 'cron'`)).n);
    const other = await startTestApp({}, t.config);
    try {
      const before = await cronRuns();
      await svc.runScheduled(new AbortController().signal, due);
      expect(await cronRuns()).toBe(before + 1);
      // Another instance whose timer fired late, for the same tick, once the first run is over.
      await other.app.get(ReconciliationService).runScheduled(new AbortController().signal, due);
      expect(await cronRuns()).toBe(before + 1);
      // The next tick runs again.
      await other.app.get(ReconciliationService).runScheduled(new AbortController().signal, new Date());
      expect(await cronRuns()).toBe(before + 2);
    } finally {
      await other.close();
    }
  });

  it('the cron (RECONCILE_CRON from config) starts runs, and two instances on one database never run two at once', async () => {
    const config = { ...t.config, SCHEDULER_ENABLED: true, RECONCILE_CRON: '* * * * * *', EXPIRE_CRON: '0 0 0 1 1 *' } as AppConfig;
    const [a, b] = [await startTestApp({}, config), await startTestApp({}, config)];
    try {
      const count = async () =>
        Number((await one<{ n: string }>(`SELECT COUNT(*) AS n FROM reconciliation_run WHERE triggered_by = 'cron'`)).n);
      const before = await count();
      // Ticks come every second, but one that fires while a run is on is skipped: wait for two runs.
      for (const deadline = Date.now() + 20_000; (await count()) < before + 2 && Date.now() < deadline;)
        await new Promise((r) => setTimeout(r, 100));
      const cronRuns: { started_at: Date; finished_at: Date | null; status: string }[] = await sql(
        `SELECT started_at, finished_at, status FROM reconciliation_run WHERE triggered_by = 'cron' ORDER BY id`,
      );
      expect(cronRuns.length - before).toBeGreaterThanOrEqual(2);
      for (let i = 1; i < cronRuns.length; i++)
        expect(cronRuns[i].started_at.getTime()).toBeGreaterThanOrEqual(cronRuns[i - 1].finished_at!.getTime());
    } finally {
      await a.close();
      await b.close();
    }
    expect(await one(`SELECT COUNT(*) AS n FROM reconciliation_run WHERE status = 'RUNNING'`)).toEqual({ n: '0' });
  });
});

describe('reconciliation: progress of a run that records many discrepancies', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  /** `n` coupons set USED by hand, with no redemption, each logged as issued: one chunk of `n` findings, recorded one by one. */
  const usedByHand = async (prefix: string, n: number) => {
    const { id: couponId } = await createCoupon(t.url, { totalStock: 5 });
    const first = await grabUserCoupon(t.url, couponId, `${prefix}-0`);
    await t.db.query(
      `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, idempotency_key, issued_at, valid_from, expires_at, updated_at, used_at)
       SELECT coupon_id, CONCAT(?, '-', s.seq), 'USED', 'BULK', 0, NULL, issued_at, valid_from, expires_at, updated_at, NOW(3)
       FROM user_coupon, seq_1_to_${n} s WHERE id = ?`,
      [prefix, first.id],
    );
    await t.db.query(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at)
       SELECT uc.id, NULL, 'UNUSED', CONCAT('test:', uc.id), NULL, uc.issued_at FROM user_coupon uc WHERE uc.coupon_id = ? AND uc.id <> ?`,
      [couponId, first.id],
    );
  };

  it('writes its count of discrepancies as it records them, not only between chunks', async () => {
    await usedByHand('progress', 1000);
    const { runId, done } = await t.app.get(ReconciliationService).start('FULL', 'test');
    const seen = new Set<number>();
    let finished = false;
    void done.then(() => (finished = true));
    while (!finished) {
      const [row] = (await t.db.query(`SELECT status, discrepancies FROM reconciliation_run WHERE id = ?`, [runId])) as {
        status: string;
        discrepancies: number;
      }[];
      if (row.status === 'RUNNING') seen.add(Number(row.discrepancies));
      await new Promise((r) => setTimeout(r, 50));
    }
    expect((await done).discrepancies).toBe(1000);
    // A count between none and all while it ran: the operator watching the run sees it move.
    expect([...seen].some((n) => n > 0 && n < 1000)).toBe(true);
  });

  it('a running run is answered with as many discrepancies as it lists by type, and its first chunk counted at once', async () => {
    await usedByHand('running', 300);
    const { runId, done } = await t.app.get(ReconciliationService).start('FULL', 'test');
    let finished = false;
    void done.then(() => (finished = true));
    const views: { checked: number; discrepancies: number; listed: number }[] = [];
    while (!finished) {
      const view = (await request(t.url).get(`/admin/reconciliation/runs/${runId}`).set(bearer(adminToken()))).body as {
        status: string;
        checked: number;
        discrepancies: number;
        byType: Record<string, number>;
      };
      const listed = Object.values(view.byType).reduce((a, b) => a + b, 0);
      if (view.status === 'RUNNING' && listed > 0) views.push({ checked: view.checked, discrepancies: view.discrepancies, listed });
    }
    expect((await done).discrepancies).toBe(300);
    expect(views.length).toBeGreaterThan(0);
    expect(views.filter((v) => v.discrepancies !== v.listed || v.checked === 0)).toEqual([]);
  });
});
