import type { QueryRunner } from 'typeorm';
import { couponBody } from '../support/factories.js';
import { adminToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, Reply, sleep } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

/** Seconds the server's pool connections wait for a row lock (set per session by the test preload, not globally). */
const LOCK_WAIT_S = 1;
const TX_RETRIES = 2;
const DEADLOCK_ROUNDS = 4;

/**
 * Lock-wait timeouts and deadlocks provoked on purpose by a test session that holds or races for
 * the rows the service needs. The server's sessions get innodb_lock_wait_timeout = 1 s through a
 * preload that runs SET SESSION on each new pool connection, so the global 50 s that everyone else
 * on this MariaDB uses is never touched. DB_TX_RETRIES = 2: each transaction is tried three times.
 */
describe('lock-wait timeouts and deadlocks', () => {
  let fdb: FaultDatabase;
  let server: Server;
  let couponId: string;
  const figures = {
    requests: 0,
    faults: 0,
    deadlocks: 0,
    serverWasVictim: 0,
    lockWaitTimeouts: 0,
    violations: 0,
    acknowledgedWritesLost: 0,
  };

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
    server = await startServer({ dbName: fdb.name, lockWaitTimeout: LOCK_WAIT_S, env: { DB_TX_RETRIES: String(TX_RETRIES) } });
    const created = await call(server.url, 'POST', '/admin/coupons', {
      token: adminToken(),
      body: couponBody({ totalStock: 1000, perUserLimit: 5 }),
    });
    expect(created.status).toBe(201);
    couponId = created.body.id as string;
  });
  afterAll(async () => {
    figures.violations = (await checkInvariants(fdb.db)).length;
    report({ scenario: 'lock-wait timeouts and deadlocks', ...figures });
    await server?.stop();
    await fdb?.close();
  });

  const grab = (user: string, key: string) => {
    figures.requests++;
    return call(server.url, 'POST', `/coupons/${couponId}/grab`, { token: tokenFor(user), headers: { 'idempotency-key': key } });
  };
  const redeem = (user: string, userCouponId: string, orderNo: string) => {
    figures.requests++;
    return call(server.url, 'POST', '/redemptions', { token: tokenFor(user), body: { userCouponId, orderNo, orderAmountCents: 50_000 } });
  };
  const stock = () => count(fdb.db, `SELECT stock AS n FROM coupon_stock WHERE coupon_id = ?`, [couponId]);
  async function retriesOf(errno: number): Promise<number> {
    const text = ((await call(server.url, 'GET', '/metrics')).body.text as string | undefined) ?? '';
    return Number(new RegExp(`^db_transaction_retries_total\\{errno="${errno}"\\} (\\d+)`, 'm').exec(text)?.[1] ?? 0);
  }
  /** A test session in a transaction of its own, with a short lock wait so that it never hangs the suite. */
  async function session(): Promise<QueryRunner> {
    const runner = fdb.db.createQueryRunner();
    await runner.connect();
    await runner.query('SET SESSION innodb_lock_wait_timeout = 5');
    await runner.startTransaction();
    return runner;
  }
  async function end(runner: QueryRunner): Promise<void> {
    if (runner.isReleased) return;
    if (runner.isTransactionActive) await runner.rollbackTransaction().catch(() => undefined);
    await runner.release();
  }
  /** Waits until one of the server's statements on this database waits for a lock and matches `query` (mysql2 sends values inline, so it can name them). */
  async function serverWaitingOn(query: string): Promise<void> {
    for (let i = 0; i < 40; i++) {
      // InnoDB refreshes what innodb_trx shows only when it was not read for 100 ms.
      await sleep(120);
      const n = await count(
        fdb.db,
        `SELECT COUNT(*) AS n FROM information_schema.innodb_trx t JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
         WHERE p.db = ? AND t.trx_state = 'LOCK WAIT' AND t.trx_query LIKE ?`,
        [fdb.name, query],
      );
      if (n > 0) return;
    }
    throw new Error(`the server never waited on ${query}`);
  }
  const issuedTo = (user: string) => count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE user_id = ?`, [user]);

  it('a stock row held past the lock wait: grabs retry a bounded number of times, then 503, nothing written', async () => {
    const retriesBefore = await retriesOf(1205);
    const stockBefore = await stock();
    const holder = await session();
    let replies: Reply[];
    try {
      await holder.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ? FOR UPDATE`, [couponId]);
      figures.faults++;
      // The lock is held until every grab has answered: each answer comes from the bounded retries alone.
      replies = await Promise.all(Array.from({ length: 10 }, (_, i) => grab(`waiter-${i}`, `wait-${i}`)));
    } finally {
      await end(holder);
    }
    expect(replies.map((r) => [r.status, r.body.code])).toEqual(replies.map(() => [503, 'SERVICE_UNAVAILABLE']));
    // Grabs of one coupon may share a transaction; each failed transaction was tried exactly 1 + TX_RETRIES times.
    const retried = (await retriesOf(1205)) - retriesBefore;
    figures.lockWaitTimeouts += retried + retried / TX_RETRIES;
    expect(retried).toBeGreaterThanOrEqual(TX_RETRIES);
    expect(retried % TX_RETRIES).toBe(0);
    expect(Math.max(...replies.map((r) => r.ms))).toBeLessThan(20_000);
    expect(await stock()).toBe(stockBefore);
    for (let i = 0; i < 10; i++) expect(await issuedTo(`waiter-${i}`)).toBe(0);

    const again = await Promise.all(Array.from({ length: 10 }, (_, i) => grab(`waiter-${i}`, `wait-${i}`)));
    expect(again.map((r) => r.status)).toEqual(again.map(() => 201));
    expect(await stock()).toBe(stockBefore - 10);
  });

  it('a user coupon row held past the lock wait: the redemption retries, then 503, nothing written; the retry redeems', async () => {
    const issued = await grab('locked-out', 'lo-1');
    expect(issued.status).toBe(201);
    const retriesBefore = await retriesOf(1205);
    const holder = await session();
    let reply: Reply;
    try {
      await holder.query(`SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`, [issued.body.id]);
      figures.faults++;
      reply = await redeem('locked-out', issued.body.id as string, 'LO-ORDER');
    } finally {
      await end(holder);
    }
    expect([reply.status, reply.body.code]).toEqual([503, 'SERVICE_UNAVAILABLE']);
    const retried = (await retriesOf(1205)) - retriesBefore;
    figures.lockWaitTimeouts += retried + 1;
    expect(retried).toBe(TX_RETRIES);
    expect(reply.ms).toBeGreaterThanOrEqual((TX_RETRIES + 1) * LOCK_WAIT_S * 1000 - 100);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM redemption WHERE order_no = 'LO-ORDER'`)).toBe(0);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE id = ? AND status = 'UNUSED'`, [issued.body.id])).toBe(1);

    const retry = await redeem('locked-out', issued.body.id as string, 'LO-ORDER');
    expect([retry.status, retry.body.firstUse]).toEqual([201, true]);
  });

  /**
   * The rival session first takes the row the server is about to insert (uncommitted), waits until
   * the server's INSERT waits for it while holding its own lock, then asks for that lock: a cycle,
   * which InnoDB breaks by rolling one side back. Checks that it really was a deadlock.
   */
  async function deadlock(
    take: [string, unknown[]],
    send: () => Promise<Reply>,
    serverInsert: string,
    want: [string, unknown[]],
  ): Promise<Reply> {
    const retriesBefore = await retriesOf(1213);
    const rival = await session();
    let sessionWasVictim = false;
    let reply: Reply;
    try {
      await rival.query(...take);
      const pending = send();
      await serverWaitingOn(serverInsert);
      try {
        await rival.query(...want);
      } catch (err) {
        if ((err as { driverError?: { errno?: number } }).driverError?.errno !== 1213) throw err;
        sessionWasVictim = true;
      }
      figures.faults++;
      await end(rival);
      reply = await pending;
    } finally {
      await end(rival);
    }
    expect(sessionWasVictim || (await retriesOf(1213)) > retriesBefore).toBe(true);
    figures.deadlocks++;
    if (!sessionWasVictim) figures.serverWasVictim++;
    return reply;
  }

  it.each(Array.from({ length: DEADLOCK_ROUNDS }, (_, i) => i + 1))(
    'deadlock %i on a grab: one side is rolled back and retried, exactly one coupon results',
    async (round) => {
      const user = `deadlocked-${round}`;
      const key = `dl-${round}`;
      const stockBefore = await stock();
      const reply = await deadlock(
        [
          `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, idempotency_key, issued_at, valid_from, expires_at, updated_at)
         VALUES (?, ?, 'UNUSED', 'GRAB', 1, ?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) + INTERVAL 1 DAY, UTC_TIMESTAMP(3))`,
          [couponId, user, key],
        ],
        () => grab(user, key),
        `INSERT INTO user_coupon%'${key}'%`,
        [`SELECT stock FROM coupon_stock WHERE coupon_id = ? FOR UPDATE`, [couponId]],
      );
      expect(reply.status).toBe(201);
      expect(await issuedTo(user)).toBe(1);
      expect(await stock()).toBe(stockBefore - 1);
    },
  );

  it.each(Array.from({ length: DEADLOCK_ROUNDS }, (_, i) => i + 1))(
    'deadlock %i on a redemption: one side is rolled back and retried, exactly one redemption results',
    async (round) => {
      const user = `rdl-${round}`;
      const issued = await grab(user, `rdl-key-${round}`);
      expect(issued.status).toBe(201);
      const orderNo = `RDL-${round}`;
      const reply = await deadlock(
        [
          `INSERT INTO redemption (user_coupon_id, order_no, user_id, order_amount_cents, discount_cents, status, used_at) VALUES (?, ?, ?, 1, 1, 'USED', UTC_TIMESTAMP(3))`,
          [issued.body.id, orderNo, user],
        ],
        () => redeem(user, issued.body.id as string, orderNo),
        `INSERT INTO%redemption%'${orderNo}'%`,
        [`SELECT id FROM user_coupon WHERE id = ? FOR UPDATE`, [issued.body.id]],
      );
      expect([reply.status, reply.body.firstUse]).toEqual([201, true]);
      expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM redemption WHERE user_coupon_id = ?`, [issued.body.id])).toBe(1);
      expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE id = ? AND status = 'USED'`, [issued.body.id])).toBe(1);
    },
  );

  it('leaves the database consistent', async () => {
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });
});
