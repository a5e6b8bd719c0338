import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { couponBody } from '../support/factories.js';
import { adminToken, serviceToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { createFaultDatabase, FaultDatabase } from './support/db.js';
import { call } from './support/http.js';
import { buildServer, ROOT, Server, startServer } from './support/server.js';

/**
 * The checker itself: quiet on a database the service wrote, and loud on each kind of damage the
 * fault scenarios are looking for. Each corruption is made in a transaction the checker reads
 * through, then rolled back.
 */
describe('invariant checker', () => {
  let fdb: FaultDatabase;
  let server: Server;
  const ids: Record<string, string> = {};

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
    server = await startServer({ dbName: fdb.name });
    const admin = adminToken();
    const coupon = await call(server.url, 'POST', '/admin/coupons', {
      token: admin,
      body: couponBody({ totalStock: 10, perUserLimit: 2, returnOnRefund: true }),
    });
    expect(coupon.status).toBe(201);
    ids.coupon = coupon.body.id as string;
    const grab = async (user: string, key: string) => {
      const r = await call(server.url, 'POST', `/coupons/${ids.coupon}/grab`, {
        token: tokenFor(user),
        headers: { 'idempotency-key': key },
      });
      expect(r.status).toBe(201);
      return r.body.id as string;
    };
    ids.unused = await grab('alice', 'a-1');
    ids.used = await grab('alice', 'a-2');
    ids.bobs = await grab('bob', 'b-1');
    const redeemed = await call(server.url, 'POST', '/redemptions', {
      token: tokenFor('alice'),
      body: { userCouponId: ids.used, orderNo: 'O-1', orderAmountCents: 100_000 },
    });
    expect(redeemed.status).toBe(201);
    const refund = await call(server.url, 'POST', '/redemptions/refunds', {
      token: serviceToken(),
      body: { userCouponId: ids.used, orderNo: 'O-1', refundNo: 'R-1' },
    });
    expect(refund.status).toBe(201);
    ids.replacement = refund.body.replacementUserCoupon?.id as string;
    ids.held = await grab('carol', 'c-1');
    const held = await call(server.url, 'POST', '/redemptions/holds', {
      token: tokenFor('carol'),
      body: { userCouponId: ids.held, orderNo: 'H-1', orderAmountCents: 20_000, ttlSeconds: 3600 },
    });
    expect(held.status).toBe(201);
  });
  afterAll(async () => {
    await server?.stop();
    await fdb?.close();
  });

  it('finds nothing wrong in what the service wrote', async () => {
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });

  const now = `UTC_TIMESTAMP(3)`;
  const corruptions: [string, string, () => string[]][] = [
    ['stock not matching the coupons issued', 'stock', () => [`UPDATE coupon_stock SET stock = stock - 1 WHERE coupon_id = ${ids.coupon}`]],
    [
      'negative stock',
      'stock',
      () => [`UPDATE coupon_stock SET stock = -1, init_stock = init_stock - stock - 1 WHERE coupon_id = ${ids.coupon}`],
    ],
    [
      'a user over the per-user limit',
      'per-user limit',
      () => [
        `UPDATE coupon_stock SET stock = stock - 1 WHERE coupon_id = ${ids.coupon}`,
        `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, issued_at, valid_from, expires_at, updated_at) VALUES (${ids.coupon}, 'alice', 'UNUSED', 'GRAB', 1, ${now}, ${now}, ${now} + INTERVAL 1 DAY, ${now})`,
        `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, created_at) VALUES (LAST_INSERT_ID(), NULL, 'UNUSED', 'x', ${now})`,
      ],
    ],
    [
      'USED without a redemption',
      'used/redemption',
      () => [`UPDATE user_coupon SET status = 'USED', used_at = ${now} WHERE id = ${ids.unused}`],
    ],
    [
      'a redemption of a coupon that is not USED',
      'used/redemption',
      () => [
        `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at) VALUES (${ids.unused}, 'X-1', 'alice', 1, 1, 'USED', ${now})`,
      ],
    ],
    [
      'a redemption of a coupon that does not exist',
      'orphan redemption',
      () => [
        `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at) VALUES (987654321, 'X-2', 'alice', 1, 1, 'USED', ${now})`,
      ],
    ],
    [
      'a redemption recorded for another user',
      'redemption owner',
      () => [`UPDATE redemption SET user_id = 'mallory' WHERE user_coupon_id = ${ids.used}`],
    ],
    [
      'a status change without its log row',
      'log',
      () => [`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ${ids.used} AND to_status = 'USED'`],
    ],
    [
      'an illegal step in the log',
      'log',
      () => [
        `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, created_at) VALUES (${ids.used}, 'USED', 'UNUSED', 'x', ${now})`,
      ],
    ],
    ['a coupon with no issuance log row', 'log', () => [`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ${ids.bobs}`]],
    ['USED without used_at', 'used_at', () => [`UPDATE user_coupon SET used_at = NULL WHERE id = ${ids.used}`]],
    [
      'a grabbed coupon marked as not from stock',
      'source/from_stock',
      () => [`UPDATE user_coupon SET from_stock = 0 WHERE id = ${ids.bobs}`],
    ],
    ['a refund return coupon without its refund', 'refund return without refund', () => [`DELETE FROM refund WHERE refund_no = 'R-1'`]],
    [
      'a refund of a redemption that does not exist',
      'refund',
      () => [`UPDATE refund SET redemption_id = 987654321 WHERE refund_no = 'R-1'`],
    ],
    [
      'a refund whose replacement is missing',
      'refund',
      () => [`UPDATE refund SET replacement_user_coupon_id = 987654321 WHERE refund_no = 'R-1'`],
    ],
    ['a LOCKED coupon without an ACTIVE hold', 'locked/hold', () => [`DELETE FROM redemption_hold WHERE user_coupon_id = ${ids.held}`]],
    [
      'an ACTIVE hold of a coupon that is not LOCKED',
      'locked/hold',
      () => [
        `UPDATE user_coupon SET status = 'UNUSED', locked_until = NULL WHERE id = ${ids.held}`,
        `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, created_at) VALUES (${ids.held}, 'LOCKED', 'UNUSED', 'x', ${now})`,
      ],
    ],
    [
      'two ACTIVE holds on one coupon',
      'locked/hold',
      () => [
        `INSERT INTO redemption_hold (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, expires_at, created_at)
         SELECT user_coupon_id, 'H-2', user_id, order_amount_cents, discount_cents, 'ACTIVE', expires_at, created_at FROM redemption_hold WHERE user_coupon_id = ${ids.held}`,
      ],
    ],
    [
      'a LOCKED coupon that times out at another moment than its hold',
      'locked/hold',
      () => [`UPDATE user_coupon SET locked_until = locked_until + INTERVAL 1 MINUTE WHERE id = ${ids.held}`],
    ],
    [
      'a hold recorded for another user',
      'hold',
      () => [`UPDATE redemption_hold SET user_id = 'mallory' WHERE user_coupon_id = ${ids.held}`],
    ],
    [
      'a RELEASED hold without its release time',
      'hold',
      () => [
        `UPDATE redemption_hold SET status = 'RELEASED', released_at = NULL, release_reason = 'CANCELLED' WHERE user_coupon_id = ${ids.held}`,
      ],
    ],
    [
      'an order whose discounts exceed its amount',
      'order discounts',
      () => [`UPDATE redemption_hold SET discount_cents = order_amount_cents + 1 WHERE user_coupon_id = ${ids.held}`],
    ],
  ];

  it.each(corruptions)('finds %s', async (_, label, statements) => {
    const runner = fdb.db.createQueryRunner();
    await runner.connect();
    await runner.startTransaction();
    try {
      for (const sql of statements()) await runner.query(sql);
      const violations = await checkInvariants(runner.manager);
      expect(violations.some((v) => v.startsWith(`${label}:`))).toBe(true);
    } finally {
      await runner.rollbackTransaction();
      await runner.release();
    }
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });

  it('npm run check:invariants exits 0 on a sound database and 1, listing the violations, on a damaged one', async () => {
    const script = join(ROOT, 'node_modules/.cache/coupon-engine-faults/scripts/check-invariants.js');
    const env = { ...process.env, DB_NAME: 'not_this_one' };
    const run = () =>
      promisify(execFile)(process.execPath, [script, '--db', fdb.name], { env }).then(
        (r) => ({ code: 0, stdout: r.stdout }),
        (e: { code: number; stdout: string }) => ({ code: e.code, stdout: e.stdout }),
      );
    expect(await run()).toEqual({ code: 0, stdout: '' });
    await fdb.db.query(`UPDATE coupon_stock SET stock = stock + 5 WHERE coupon_id = ?`, [ids.coupon]);
    try {
      const damaged = await run();
      expect(damaged.code).toBe(1);
      expect(damaged.stdout).toMatch(/^stock: \{.*"coupon_id":"\d+"/m);
    } finally {
      await fdb.db.query(`UPDATE coupon_stock SET stock = stock - 5 WHERE coupon_id = ?`, [ids.coupon]);
    }
    expect((await run()).code).toBe(0);
  });
});
