import { couponBody } from '../support/factories.js';
import { adminToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, mapConcurrent, sleep } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

const USERS = 400;
const TTL_SECONDS = 3;
/** Holds in flight at once: the shoppers at checkout, each placing the next hold once answered. */
const CONNECTIONS = 50;

/**
 * kill -9 of the server while 400 checkout holds are being placed (50 in flight at a time), then a
 * restart on the same database: every acknowledged hold is stored, and after the restart the holds
 * time out and are released by the sweep (no coupon stays LOCKED, none is LOCKED without an ACTIVE
 * hold).
 */
describe('kill -9 with active holds', () => {
  let fdb: FaultDatabase;
  let server: Server | undefined;
  const figures = { requests: 0, faults: 0, violations: 0, acknowledgedWritesLost: 0, acknowledged: 0, answerLost: 0, released: 0 };

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
  });
  afterAll(async () => {
    report({ scenario: 'kill -9 with active holds', ...figures });
    await server?.stop();
    await fdb?.close();
  });

  it('loses no acknowledged hold, and after the restart every hold times out and its coupon comes back', async () => {
    const env = { SCHEDULER_ENABLED: 'true', HOLD_SWEEP_SECONDS: '1' };
    server = await startServer({ dbName: fdb.name, env });
    const created = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: USERS }) });
    expect(created.status).toBe(201);
    const users = Array.from({ length: USERS }, (_, i) => `hc-u${i}`);
    const current = server;
    const grabs = await mapConcurrent(users, 50, (user) =>
      call(current.url, 'POST', `/coupons/${created.body.id}/grab`, { token: tokenFor(user), headers: { 'idempotency-key': `${user}-k` } }),
    );
    expect(grabs.every((g) => g.status === 201)).toBe(true);
    figures.requests += USERS + 1;

    // kill -9 at the USERS/4th answer, and no hold sent after it. With all 400 in flight at once, a
    // client slower than the server could count the trigger after the last answer had left, so no
    // answer would be lost; with at most CONNECTIONS in flight the server is at most that far ahead.
    let answered = 0;
    let crashing: Promise<void> | undefined;
    const holds = await mapConcurrent(
      users,
      CONNECTIONS,
      async (user, i) => {
        const ucId = grabs[i].body.id as string;
        const orderNo = `hc-order-${i}`;
        const reply = await call(current.url, 'POST', '/redemptions/holds', {
          token: tokenFor(user),
          body: { userCouponId: ucId, orderNo, orderAmountCents: 20000, ttlSeconds: TTL_SECONDS },
          timeoutMs: 30_000,
        });
        if (reply.status !== 0 && ++answered === USERS / 4) crashing = current.crash();
        return { user, ucId, orderNo, reply };
      },
      () => crashing !== undefined,
    );
    await crashing;
    figures.faults++;
    figures.requests += holds.length;
    const acked = holds.filter((h) => h.reply.status === 201);
    const lost = holds.filter((h) => h.reply.status === 0 || h.reply.status === 503);
    expect(acked.length).toBeGreaterThan(0);
    expect(lost.length).toBeGreaterThan(0);
    expect(holds.filter((h) => h.reply.status >= 500 && h.reply.status !== 503)).toEqual([]);

    // Every acknowledged hold is stored, with the id it was answered with.
    const stored = (await fdb.db.query(`SELECT id, order_no, user_coupon_id FROM redemption_hold`)) as {
      id: string;
      order_no: string;
      user_coupon_id: string;
    }[];
    const byPair = new Map(stored.map((h) => [`${h.order_no}/${h.user_coupon_id}`, String(h.id)]));
    const missing = acked.filter((h) => byPair.get(`${h.orderNo}/${h.ucId}`) !== h.reply.body.holdId);
    figures.acknowledgedWritesLost = missing.length;
    expect(missing).toEqual([]);
    expect(await checkInvariants(fdb.db)).toEqual([]);

    server = await startServer({ dbName: fdb.name, env });
    // A hold whose answer was lost is told by repeating it: it answers the stored hold, or places it now.
    const restarted = server;
    const repeats = await mapConcurrent(lost, 50, (h) =>
      call(restarted.url, 'POST', '/redemptions/holds', {
        token: tokenFor(h.user),
        body: { userCouponId: h.ucId, orderNo: h.orderNo, orderAmountCents: 20000, ttlSeconds: TTL_SECONDS },
      }),
    );
    figures.requests += repeats.length;
    lost.forEach((h, i) => {
      const r = repeats[i];
      if (byPair.has(`${h.orderNo}/${h.ucId}`))
        expect([h.orderNo, r.status, r.body.holdId]).toEqual([h.orderNo, 200, byPair.get(`${h.orderNo}/${h.ucId}`)]);
      else expect([h.orderNo, r.status]).toEqual([h.orderNo, 201]);
    });

    // Nothing is confirmed: every hold times out and the sweep stores its release.
    const deadline = Date.now() + 60_000;
    while ((await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE status = 'LOCKED'`)) > 0 && Date.now() < deadline)
      await sleep(500);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE status = 'LOCKED'`)).toBe(0);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM redemption_hold WHERE status <> 'RELEASED' OR release_reason <> 'TIMEOUT'`)).toBe(
      0,
    );
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE status <> 'UNUSED'`)).toBe(0);
    figures.released = await count(fdb.db, `SELECT COUNT(*) AS n FROM redemption_hold`);
    // Every coupon is usable again: reads show it UNUSED.
    const reads = await mapConcurrent(users.slice(0, 50), 25, (user, i) =>
      call(restarted.url, 'GET', `/me/coupons/${grabs[i].body.id}`, { token: tokenFor(user) }),
    );
    expect(reads.every((r) => r.status === 200 && r.body.status === 'UNUSED')).toBe(true);
    const violations = await checkInvariants(fdb.db);
    figures.violations = violations.length;
    figures.acknowledged = acked.length;
    figures.answerLost = lost.length;
    expect(violations).toEqual([]);
  });
});
