import request from 'supertest';
import type { EntityManager } from 'typeorm';
import { AppError } from '../src/common/errors.js';
import { IssueService } from '../src/ledger/issue.service.js';
import { TransactionService } from '../src/database/transaction.service.js';
import { StateMachineService } from '../src/ledger/state-machine.service.js';
import { isLegal, USER_COUPON_STATUSES, UserCouponStatus } from '../src/ledger/transitions.js';
import { createCoupon, CouponView, grabUserCoupon } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';

const DAY = 86_400_000;

interface LogRow {
  from_status: string | null;
  to_status: string;
  tx_id: string;
  reason: string | null;
}

describe('state machine', () => {
  let t: TestApp;
  let tx: TransactionService;
  let sm: StateMachineService;
  let coupon: CouponView;
  let seq = 0;

  beforeAll(async () => {
    t = await startTestApp();
    tx = t.app.get(TransactionService);
    sm = t.app.get(StateMachineService);
    coupon = await createCoupon(t.url, { totalStock: 10_000, validity: { type: 'RELATIVE', days: 7 } });
  });
  afterAll(() => t.close());

  /** A fresh UNUSED coupon; `ageDays` > 7 makes it already past its expiry. */
  const issue = async (userId = `sm-user-${++seq}`, ageDays = 0): Promise<string> => {
    const now = new Date(Date.now() - ageDays * DAY);
    const couponRef = { id: coupon.id, validityType: 'RELATIVE' as const, validityDays: 7, validityStartAt: null, validityEndAt: null };
    const uc = await tx.inTransaction((em) =>
      t.app.get(IssueService).issue(em, { coupon: couponRef, userId, source: 'GRAB', fromStock: true, txId: `test-issue-${seq}`, now }),
    );
    return uc.id;
  };
  /** What a redemption does, so invariant 4 (USED exactly when one USED redemption) keeps holding. */
  const use = async (em: EntityManager, id: string, orderNo: string) => {
    await sm.transit(em, id, 'UNUSED', 'USED', `order:${orderNo}`, 'redeemed');
    await em.query(
      `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at) SELECT id, ?, user_id, 20000, 1000, 'USED', used_at FROM user_coupon WHERE id = ?`,
      [orderNo, id],
    );
  };
  /** What a hold does, so invariant 6 (LOCKED exactly when one ACTIVE hold) keeps holding. */
  const hold = async (em: EntityManager, id: string, from: UserCouponStatus, orderNo: string) => {
    await sm.transit(em, id, from, 'LOCKED', `hold:${orderNo}`, 'held');
    const until = new Date(Date.now() + 3600_000);
    await em.query(
      `INSERT INTO redemption_hold (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, expires_at, created_at)
       SELECT id, ?, user_id, 20000, 1000, 'ACTIVE', ?, NOW(3) FROM user_coupon WHERE id = ?`,
      [orderNo, until, id],
    );
    await em.query(`UPDATE user_coupon SET locked_until = ? WHERE id = ?`, [until, id]);
  };
  // A default order number is per coupon: one order carries one coupon.
  const move = (id: string, from: UserCouponStatus, to: UserCouponStatus, txId?: string) =>
    tx.inTransaction((em) =>
      to === 'USED' && from === 'UNUSED'
        ? use(em, id, txId ?? `test-${from}-${to}-${id}`)
        : to === 'LOCKED'
          ? hold(em, id, from, txId ?? `test-${from}-${to}-${id}`)
          : sm.transit(em, id, from, to, txId ?? `test-${from}-${to}`, `test ${to}`),
    );
  const row = async (id: string) =>
    ((await t.db.query(`SELECT status, used_at, updated_at FROM user_coupon WHERE id = ?`, [id])) as Record<string, unknown>[])[0];
  const logOf = (id: string): Promise<LogRow[]> =>
    t.db.query(`SELECT from_status, to_status, tx_id, reason FROM user_coupon_state_log WHERE user_coupon_id = ? ORDER BY id`, [id]);
  const steps = async (id: string) => (await logOf(id)).map((l) => `${l.from_status}>${l.to_status}`);
  const codeOf = (p: Promise<unknown>) =>
    p.then(
      () => 'OK',
      (e: unknown) => (e instanceof AppError ? e.code : String(e)),
    );

  /** Brings a fresh coupon to `status` through legal moves. */
  const couponIn = async (status: UserCouponStatus): Promise<string> => {
    const id = await issue();
    if (status !== 'UNUSED') await move(id, 'UNUSED', status);
    return id;
  };

  describe('transit()', () => {
    it.each([[['USED']], [['EXPIRED']], [['VOID']], [['EXPIRED', 'VOID']]] as UserCouponStatus[][][])(
      'moves UNUSED through %j, each step logged exactly once',
      async (path) => {
        const id = await issue();
        let from: UserCouponStatus = 'UNUSED';
        for (const to of path) {
          await move(id, from, to, `tx-${id}-${to}`);
          from = to;
        }
        const r = await row(id);
        expect(r.status).toBe(path[path.length - 1]);
        expect(r.used_at === null).toBe(!path.includes('USED'));
        const log = await logOf(id);
        expect(log.map((l) => `${l.from_status}>${l.to_status}`)).toEqual([
          'null>UNUSED',
          ...path.map((to, i) => `${i === 0 ? 'UNUSED' : path[i - 1]}>${to}`),
        ]);
        expect(log.slice(1).map((l) => l.tx_id)).toEqual(path.map((to) => (to === 'USED' ? `order:tx-${id}-${to}` : `tx-${id}-${to}`)));
      },
    );

    const illegal = USER_COUPON_STATUSES.flatMap((from) =>
      USER_COUPON_STATUSES.filter((to) => !isLegal(from, to)).map((to) => [from, to] as const),
    );
    it.each(illegal)('refuses %s -> %s with ILLEGAL_TRANSITION and changes nothing', async (from, to) => {
      const id = await couponIn(from);
      const [before, logBefore] = [await row(id), await logOf(id)];
      await expect(codeOf(move(id, from, to))).resolves.toBe('ILLEGAL_TRANSITION');
      expect(await row(id)).toEqual(before);
      expect(await logOf(id)).toEqual(logBefore);
    });

    it('answers STATUS_CONFLICT and changes nothing when the coupon is no longer in `from`', async () => {
      const id = await couponIn('USED');
      const [before, logBefore] = [await row(id), await logOf(id)];
      await expect(codeOf(move(id, 'UNUSED', 'VOID'))).resolves.toBe('STATUS_CONFLICT');
      await expect(codeOf(move(id, 'EXPIRED', 'VOID'))).resolves.toBe('STATUS_CONFLICT');
      expect(await row(id)).toEqual(before);
      expect(await logOf(id)).toEqual(logBefore);
    });

    it('answers STATUS_CONFLICT for a coupon that does not exist', async () => {
      await expect(codeOf(move('999999999', 'UNUSED', 'VOID'))).resolves.toBe('STATUS_CONFLICT');
      expect(await t.db.query(`SELECT id FROM user_coupon_state_log WHERE user_coupon_id = 999999999`)).toEqual([]);
    });

    it('20 concurrent conflicting moves (void, use, expire) on one coupon: exactly one wins and is logged once, the rest conflict', async () => {
      const targets: UserCouponStatus[] = ['VOID', 'USED', 'EXPIRED'];
      for (let round = 0; round < 5; round++) {
        const id = await issue();
        const codes = await Promise.all(
          Array.from({ length: 20 }, (_, i) => codeOf(move(id, 'UNUSED', targets[(i + round) % 3], `race-${round}-${i}`))),
        );
        expect(codes.filter((c) => c === 'OK')).toHaveLength(1);
        expect(codes.filter((c) => c !== 'OK').every((c) => c === 'STATUS_CONFLICT' || c === 'ILLEGAL_TRANSITION')).toBe(true);
        const winner = targets[(codes.indexOf('OK') + round) % 3];
        expect((await row(id)).status).toBe(winner);
        expect(await steps(id)).toEqual(['null>UNUSED', `UNUSED>${winner}`]);
        const redemptions = (await t.db.query(`SELECT COUNT(*) AS n FROM redemption WHERE user_coupon_id = ?`, [id])) as { n: string }[];
        expect(Number(redemptions[0].n)).toBe(winner === 'USED' ? 1 : 0);
      }
    });

    it('keeps every invariant', async () => {
      expect(await checkInvariants(t.db)).toEqual([]);
    });
  });

  describe('POST /admin/user-coupons/:id/void', () => {
    const voidIt = (id: string, body: unknown = { reason: 'customer complaint #12' }, token = adminToken()) =>
      request(t.url)
        .post(`/admin/user-coupons/${id}/void`)
        .set(bearer(token))
        .send(body as object);

    it('voids an UNUSED coupon: 200 UserCoupon, one log row with the reason and the admin', async () => {
      const id = await issue('void-me');
      const res = await voidIt(id);
      expect(res.status).toBe(200);
      expect(res.body).toEqual({
        id,
        couponId: coupon.id,
        userId: 'void-me',
        status: 'VOID',
        source: 'GRAB',
        issuedAt: expect.any(String),
        validFrom: expect.any(String),
        expiresAt: expect.any(String),
        usedAt: null,
        replacesUserCouponId: null,
      });
      expect((await row(id)).status).toBe('VOID');
      const log = await logOf(id);
      expect(log.map((l) => `${l.from_status}>${l.to_status}`)).toEqual(['null>UNUSED', 'UNUSED>VOID']);
      expect(log[1]).toMatchObject({
        reason: 'customer complaint #12',
        tx_id: expect.stringMatching(/^admin:admin-1:void:[0-9a-f-]{36}$/),
      });
    });

    it('voids a swept EXPIRED coupon', async () => {
      const id = await couponIn('EXPIRED');
      const res = await voidIt(id);
      expect(res.status).toBe(200);
      expect(res.body.status).toBe('VOID');
      expect(await steps(id)).toEqual(['null>UNUSED', 'UNUSED>EXPIRED', 'EXPIRED>VOID']);
    });

    it('voids an UNUSED coupon past its expiry as the EXPIRED coupon it is: UNUSED>EXPIRED>VOID in one transaction', async () => {
      const id = await issue(undefined, 8);
      const res = await voidIt(id);
      expect(res.status).toBe(200);
      expect(res.body.status).toBe('VOID');
      expect(await steps(id)).toEqual(['null>UNUSED', 'UNUSED>EXPIRED', 'EXPIRED>VOID']);
      const log = await logOf(id);
      expect(log[1].tx_id).toBe(log[2].tx_id);
    });

    it.each(['USED', 'VOID'] as const)('refuses a %s coupon with 409 ILLEGAL_TRANSITION and changes nothing', async (status) => {
      const id = await couponIn(status);
      const [before, logBefore] = [await row(id), await logOf(id)];
      const res = await voidIt(id);
      expect(res.status).toBe(409);
      expect(res.body).toMatchObject({ code: 'ILLEGAL_TRANSITION', details: { userCouponId: id, from: status, to: 'VOID' } });
      expect(await row(id)).toEqual(before);
      expect(await logOf(id)).toEqual(logBefore);
    });

    it('answers 404 USER_COUPON_NOT_FOUND for an unknown coupon', async () => {
      const res = await voidIt('987654321');
      expect(res.status).toBe(404);
      expect(res.body.code).toBe('USER_COUPON_NOT_FOUND');
    });

    it.each([
      ['a non-numeric id', 'abc', { reason: 'x' }],
      ['a zero id', '0', { reason: 'x' }],
      ['a 20-digit id', '99999999999999999999', { reason: 'x' }],
      ['no reason', '1', {}],
      ['a blank reason', '1', { reason: '   ' }],
      ['a reason with a control character', '1', { reason: 'bell\u0007' }],
      ['a reason of 256 characters', '1', { reason: 'r'.repeat(256) }],
      ['a number as reason', '1', { reason: 12 }],
      ['an unknown field', '1', { reason: 'x', force: true }],
    ])('answers 400 VALIDATION_FAILED for %s', async (_label, id, body) => {
      const res = await voidIt(id, body);
      expect(res.status).toBe(400);
      expect(res.body.code).toBe('VALIDATION_FAILED');
    });

    it('10 concurrent voids and 10 concurrent redemptions of one coupon: exactly one wins, the rest get 409 or a conflict', async () => {
      for (let round = 0; round < 3; round++) {
        const id = await issue();
        const [answers, uses] = await Promise.all([
          Promise.all(Array.from({ length: 10 }, (_, i) => voidIt(id, { reason: `race ${i}` }))),
          Promise.all(Array.from({ length: 10 }, (_, i) => codeOf(move(id, 'UNUSED', 'USED', `void-race-${round}-${i}`)))),
        ]);
        const voided = answers.filter((r) => r.status === 200).length;
        const used = uses.filter((c) => c === 'OK').length;
        expect(voided + used).toBe(1);
        expect(answers.filter((r) => r.status !== 200).every((r) => r.status === 409 && r.body.code === 'ILLEGAL_TRANSITION')).toBe(true);
        expect(uses.filter((c) => c !== 'OK').every((c) => c === 'STATUS_CONFLICT')).toBe(true);
        expect(await steps(id)).toEqual(['null>UNUSED', voided ? 'UNUSED>VOID' : 'UNUSED>USED']);
      }
    });
  });

  describe('POST /admin/user-coupons/reissue', () => {
    const reissue = (body: Record<string, unknown>, token = adminToken()) =>
      request(t.url).post('/admin/user-coupons/reissue').set(bearer(token)).send(body);
    const stockOf = async (couponId: string) =>
      (
        (await t.db.query(`SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, [couponId])) as {
          init_stock: string;
          stock: string;
        }[]
      )[0];

    it('fromStock: 201 REISSUE coupon linked to the one it replaces, one unit of stock taken, init == stock + issued', async () => {
      const c = await createCoupon(t.url, { totalStock: 3 });
      const original = await tx.inTransaction((em) =>
        t.app.get(IssueService).issue(em, {
          coupon: { id: c.id, validityType: 'RELATIVE', validityDays: 7, validityStartAt: null, validityEndAt: null },
          userId: 'unlucky',
          source: 'GRAB',
          fromStock: true,
          txId: 'orig',
        }),
      );
      const res = await reissue({
        couponId: c.id,
        userId: 'unlucky',
        reason: 'broken order flow',
        fromStock: true,
        replacesUserCouponId: original.id,
      });
      expect(res.status).toBe(201);
      expect(res.body).toMatchObject({ couponId: c.id, userId: 'unlucky', status: 'UNUSED', source: 'REISSUE', usedAt: null });
      expect(res.body.id).not.toBe(original.id);
      const [stored] = (await t.db.query(`SELECT from_stock, replaces_user_coupon_id, reason FROM user_coupon WHERE id = ?`, [
        res.body.id,
      ])) as Record<string, unknown>[];
      expect(stored).toEqual({ from_stock: 1, replaces_user_coupon_id: original.id, reason: 'broken order flow' });
      expect(await stockOf(c.id)).toEqual({ init_stock: '3', stock: '1' });
      const log = await logOf(res.body.id);
      expect(log).toEqual([
        { from_status: null, to_status: 'UNUSED', tx_id: expect.stringMatching(/^admin:admin-1:reissue:/), reason: 'broken order flow' },
      ]);
      expect(await checkInvariants(t.db)).toEqual([]);
    });

    it('not fromStock: leaves the stock alone; a numeric couponId is accepted', async () => {
      const c = await createCoupon(t.url, { totalStock: 1 });
      const res = await reissue({ couponId: Number(c.id), userId: 'goodwill.user:1', reason: 'goodwill', fromStock: false });
      expect(res.status).toBe(201);
      expect(res.body.source).toBe('REISSUE');
      expect(await stockOf(c.id)).toEqual({ init_stock: '1', stock: '1' });
      const [stored] = (await t.db.query(`SELECT from_stock, replaces_user_coupon_id FROM user_coupon WHERE id = ?`, [
        res.body.id,
      ])) as Record<string, unknown>[];
      expect(stored).toEqual({ from_stock: 0, replaces_user_coupon_id: null });
    });

    it('fromStock with no stock left: 409 SOLD_OUT and nothing issued', async () => {
      const c = await createCoupon(t.url, { totalStock: 0 });
      const res = await reissue({ couponId: c.id, userId: 'late', reason: 'x', fromStock: true });
      expect(res.status).toBe(409);
      expect(res.body.code).toBe('SOLD_OUT');
      expect(await t.db.query(`SELECT id FROM user_coupon WHERE coupon_id = ?`, [c.id])).toEqual([]);
      expect(await stockOf(c.id)).toEqual({ init_stock: '0', stock: '0' });
    });

    it('10 concurrent fromStock reissues on 4 units of stock issue exactly 4', async () => {
      const c = await createCoupon(t.url, { totalStock: 4 });
      const answers = await Promise.all(
        Array.from({ length: 10 }, (_, i) => reissue({ couponId: c.id, userId: `crowd-${i}`, reason: 'x', fromStock: true })),
      );
      expect(answers.filter((r) => r.status === 201)).toHaveLength(4);
      expect(answers.filter((r) => r.status !== 201).every((r) => r.status === 409 && r.body.code === 'SOLD_OUT')).toBe(true);
      expect(await stockOf(c.id)).toEqual({ init_stock: '4', stock: '0' });
      expect(await checkInvariants(t.db)).toEqual([]);
    });

    it('a coupon is replaced once: of 8 concurrent replacements without a key one issues, the others are 409 ALREADY_REPLACED naming it', async () => {
      const c = await createCoupon(t.url, { totalStock: 5, perUserLimit: 2 });
      const original = await grabUserCoupon(t.url, c.id, 'twice-replaced');
      const body = { couponId: c.id, userId: 'twice-replaced', reason: 'ticket 88', fromStock: false, replacesUserCouponId: original.id };
      const answers = await Promise.all(Array.from({ length: 8 }, () => reissue(body)));
      const issued = answers.filter((r) => r.status === 201);
      expect(issued).toHaveLength(1);
      for (const r of answers.filter((a) => a.status !== 201))
        expect([r.status, r.body.code, r.body.details]).toEqual([
          409,
          'ALREADY_REPLACED',
          { userCouponId: original.id, replacedBy: issued[0].body.id },
        ]);
      // Its replacement may be replaced in turn.
      expect((await reissue({ ...body, replacesUserCouponId: issued[0].body.id })).status).toBe(201);
      const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE replaces_user_coupon_id = ?`, [original.id])) as {
        n: string;
      }[];
      expect(Number(n)).toBe(1);
    });

    describe('with an Idempotency-Key', () => {
      const keyed = (key: string, body: Record<string, unknown>) => reissue(body).set('Idempotency-Key', key);
      const issuedTo = async (userId: string) =>
        (await t.db.query(`SELECT id, idempotency_key FROM user_coupon WHERE user_id = ?`, [userId])) as {
          id: string;
          idempotency_key: string;
        }[];

      it('a repeat answers the first reissue (201, Idempotent-Replayed) and takes no more stock; no key issues again', async () => {
        const c = await createCoupon(t.url, { totalStock: 5 });
        const body = { couponId: c.id, userId: 'retried', reason: 'support ticket 7', fromStock: true };
        const first = await keyed('ticket-7', body);
        const again = await keyed('ticket-7', body);
        expect([first.status, again.status]).toEqual([201, 201]);
        expect(first.headers['idempotent-replayed']).toBeUndefined();
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(again.body).toEqual(first.body);
        expect(await issuedTo('retried')).toEqual([{ id: first.body.id, idempotency_key: 'reissue:ticket-7' }]);
        expect(await stockOf(c.id)).toEqual({ init_stock: '5', stock: '4' });
        const unkeyed = await reissue(body);
        expect(unkeyed.status).toBe(201);
        expect(unkeyed.body.id).not.toBe(first.body.id);
        // Voided since, the coupon is still answered as the first reissue answered it.
        const voided = await request(t.url)
          .post(`/admin/user-coupons/${first.body.id}/void`)
          .set(bearer(adminToken()))
          .send({ reason: 'test' });
        expect(voided.body.status).toBe('VOID');
        expect((await keyed('ticket-7', body)).body).toEqual(first.body);
        expect(await checkInvariants(t.db)).toEqual([]);
      });

      it('10 concurrent requests with one key issue one coupon, and all answer it', async () => {
        const c = await createCoupon(t.url, { totalStock: 5 });
        const body = { couponId: c.id, userId: 'double-clicker', reason: 'x', fromStock: true };
        const answers = await Promise.all(Array.from({ length: 10 }, () => keyed('click', body)));
        expect(answers.map((r) => r.status)).toEqual(Array(10).fill(201));
        expect(new Set(answers.map((r) => r.body.id)).size).toBe(1);
        expect(answers.filter((r) => r.headers['idempotent-replayed'] === 'true')).toHaveLength(9);
        expect(await issuedTo('double-clicker')).toHaveLength(1);
        expect(await stockOf(c.id)).toEqual({ init_stock: '5', stock: '4' });
        expect(await checkInvariants(t.db)).toEqual([]);
      });

      it('the key asking for something else is 422 IDEMPOTENCY_KEY_REUSED; the same key for another user, or a grab key, is its own', async () => {
        const c = await createCoupon(t.url, { totalStock: 5 });
        const body = { couponId: c.id, userId: 'keyed-user', reason: 'x', fromStock: true };
        const first = await keyed('k1', body);
        expect(first.status).toBe(201);
        for (const other of [{ couponId: coupon.id }, { fromStock: false }, { replacesUserCouponId: first.body.id }]) {
          const res = await keyed('k1', { ...body, ...other });
          expect([res.status, res.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
        }
        const otherUser = await keyed('k1', { ...body, userId: 'keyed-user-2' });
        expect(otherUser.status).toBe(201);
        expect(otherUser.body.id).not.toBe(first.body.id);
        // The user's own grab with the same key is a grab, not a replay of the operator's reissue.
        const grab = await request(t.url)
          .post(`/coupons/${c.id}/grab`)
          .set(bearer(tokenFor('keyed-user')))
          .set('Idempotency-Key', 'k1');
        expect(grab.status).toBe(201);
        expect(grab.body).toMatchObject({ source: 'GRAB' });
        expect(grab.headers['idempotent-replayed']).toBeUndefined();
        expect(await stockOf(c.id)).toEqual({ init_stock: '5', stock: '2' });
        expect(await checkInvariants(t.db)).toEqual([]);
      });

      it.each([
        ['an empty key', ''],
        ['a key with a colon', 'a:b'],
        ['a key over 120 characters', 'k'.repeat(121)],
      ])('400 VALIDATION_FAILED for %s, nothing issued', async (_label, key) => {
        const res = await keyed(key, { couponId: coupon.id, userId: 'bad-key-user', reason: 'x', fromStock: false });
        expect([res.status, res.body.code]).toEqual([400, 'VALIDATION_FAILED']);
        expect(await issuedTo('bad-key-user')).toEqual([]);
      });
    });

    it("404 COUPON_NOT_FOUND for an unknown coupon; 404 USER_COUPON_NOT_FOUND for an unknown or another user's replacesUserCouponId; nothing issued", async () => {
      const before = await stockOf(coupon.id);
      const count = async () => ((await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon`)) as { n: string }[])[0].n;
      const n = await count();
      const a = await reissue({ couponId: '987654321', userId: 'u', reason: 'x', fromStock: true });
      expect([a.status, a.body.code]).toEqual([404, 'COUPON_NOT_FOUND']);
      const b = await reissue({ couponId: coupon.id, userId: 'u', reason: 'x', fromStock: true, replacesUserCouponId: '987654321' });
      expect([b.status, b.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
      const someoneElses = await issue('owner');
      const c = await reissue({
        couponId: coupon.id,
        userId: 'intruder',
        reason: 'x',
        fromStock: true,
        replacesUserCouponId: someoneElses,
      });
      expect([c.status, c.body.code, c.body.message]).toEqual([
        404,
        'USER_COUPON_NOT_FOUND',
        `User coupon ${someoneElses} belongs to another user, not to intruder`,
      ]);
      expect(b.body.message).toBe('User coupon 987654321 does not exist');
      expect(await count()).toBe(String(Number(n) + 1));
      expect((await stockOf(coupon.id)).stock).toBe(String(Number(before.stock) - 1));
    });

    it.each([
      ['a userId with a space', { userId: 'bad user' }],
      ['a userId of 65 characters', { userId: 'u'.repeat(65) }],
      ['an empty userId', { userId: '' }],
      ['a missing fromStock', { fromStock: undefined }],
      ['a string fromStock', { fromStock: 'true' }],
      ['a missing reason', { reason: undefined }],
      ['a non-numeric couponId', { couponId: 'abc' }],
      ['a negative couponId', { couponId: -1 }],
      ['a fractional couponId', { couponId: 1.5 }],
      ['a non-numeric replacesUserCouponId', { replacesUserCouponId: 'x1' }],
      ['an unknown field', { priority: 'high' }],
    ])('400 VALIDATION_FAILED for %s', async (_label, override) => {
      const res = await reissue({ couponId: coupon.id, userId: 'valid-user', reason: 'x', fromStock: false, ...override });
      expect(res.status).toBe(400);
      expect(res.body.code).toBe('VALIDATION_FAILED');
    });
  });

  describe('GET /admin/user-coupons/:id/history', () => {
    const history = (id: string) => request(t.url).get(`/admin/user-coupons/${id}/history`).set(bearer(adminToken()));
    /** Deletes one log row; the returned function puts it back under its own id, so later invariant checks stay meaningful. */
    const deleteLogRow = async (id: string, to: UserCouponStatus) => {
      const [saved] = (await t.db.query(`SELECT * FROM user_coupon_state_log WHERE user_coupon_id = ? AND to_status = ?`, [
        id,
        to,
      ])) as Record<string, unknown>[];
      await t.db.query(`DELETE FROM user_coupon_state_log WHERE id = ?`, [saved.id]);
      const cols = Object.keys(saved);
      return () =>
        t.db.query(
          `INSERT INTO user_coupon_state_log (${cols.join(', ')}) VALUES (${cols.map(() => '?').join(', ')})`,
          Object.values(saved),
        );
    };

    it('lists the transitions in order and replays them to the stored status', async () => {
      const id = await couponIn('EXPIRED');
      await move(id, 'EXPIRED', 'VOID', 'final-void');
      const res = await history(id);
      expect(res.status).toBe(200);
      expect(res.body).toEqual({
        userCoupon: expect.objectContaining({ id, status: 'VOID' }),
        transitions: [
          { from: null, to: 'UNUSED', txId: expect.any(String), reason: 'GRAB', at: expect.any(String) },
          { from: 'UNUSED', to: 'EXPIRED', txId: 'test-UNUSED-EXPIRED', reason: 'test EXPIRED', at: expect.any(String) },
          { from: 'EXPIRED', to: 'VOID', txId: 'final-void', reason: 'test VOID', at: expect.any(String) },
        ],
        replayedStatus: 'VOID',
        firstInconsistentStep: null,
        consistent: true,
      });
      expect(Number.isNaN(Date.parse(res.body.transitions[2].at))).toBe(false);
    });

    it('an UNUSED coupon past its expiry shows EXPIRED but replays consistently to its stored UNUSED', async () => {
      const id = await issue(undefined, 8);
      const res = await history(id);
      expect(res.body).toMatchObject({ userCoupon: { status: 'EXPIRED' }, replayedStatus: 'UNUSED', consistent: true });
    });

    it('reports consistent:false when a log row has been deleted', async () => {
      const id = await couponIn('EXPIRED');
      await move(id, 'EXPIRED', 'VOID');
      const restore = await deleteLogRow(id, 'EXPIRED');
      const res = await history(id);
      expect(res.status).toBe(200);
      // EXPIRED -> VOID does not start where the log stood (UNUSED): the second step is where it breaks.
      expect(res.body).toMatchObject({ replayedStatus: 'UNUSED', firstInconsistentStep: 1, consistent: false });
      expect(res.body.transitions.map((s: { to: string }) => s.to)).toEqual(['UNUSED', 'VOID']);
      await restore();
      expect((await history(id)).body.consistent).toBe(true);
    });

    it('reports consistent:false when the last log row is missing (stored status ahead of the log)', async () => {
      const id = await couponIn('USED');
      const restore = await deleteLogRow(id, 'USED');
      const res = await history(id);
      // Every step there is legal: the log is short of the status, not broken.
      expect(res.body).toMatchObject({
        userCoupon: { status: 'USED' },
        replayedStatus: 'UNUSED',
        firstInconsistentStep: null,
        consistent: false,
      });
      await restore();
    });

    it('404 USER_COUPON_NOT_FOUND for an unknown coupon, 400 for a bad id', async () => {
      const res = await history('987654321');
      expect([res.status, res.body.code]).toEqual([404, 'USER_COUPON_NOT_FOUND']);
      expect((await history('-3')).status).toBe(400);
    });
  });

  describe('access', () => {
    const routes = (id: string) => [
      request(t.url).post(`/admin/user-coupons/${id}/void`).send({ reason: 'x' }),
      request(t.url).post('/admin/user-coupons/reissue').send({ couponId: coupon.id, userId: 'u', reason: 'x', fromStock: true }),
      request(t.url).get(`/admin/user-coupons/${id}/history`),
    ];
    const remainingStock = () => t.db.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ?`, [coupon.id]);

    it.each([
      ['a user', () => tokenFor('plain-user'), 403, 'FORBIDDEN'],
      ['the order service', serviceToken, 403, 'FORBIDDEN'],
    ])('refuses %s with 403 and changes nothing', async (_label, token, status, code) => {
      const id = await issue();
      const before = await remainingStock();
      for (const r of routes(id)) {
        const res = await r.set(bearer(token()));
        expect([res.status, res.body.code]).toEqual([status, code]);
      }
      expect((await row(id)).status).toBe('UNUSED');
      expect(await remainingStock()).toEqual(before);
    });

    it('refuses a request without a token with 401', async () => {
      const id = await issue();
      for (const r of routes(id)) expect((await r).status).toBe(401);
    });

    it('documents the three routes in the OpenAPI document', async () => {
      const res = await request(t.url).get('/docs-json');
      expect(Object.keys(res.body.paths)).toEqual(
        expect.arrayContaining([
          '/admin/user-coupons/{userCouponId}/void',
          '/admin/user-coupons/reissue',
          '/admin/user-coupons/{userCouponId}/history',
        ]),
      );
    });

    it('keeps every invariant', async () => {
      expect(await checkInvariants(t.db)).toEqual([]);
    });
  });
});
