import { couponBody } from '../support/factories.js';
import { adminToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../support/invariants.js';
import { count, createFaultDatabase, FaultDatabase, killConnections } from './support/db.js';
import { call, callUntilAnswered, mapConcurrent, Reply } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

const CLIENTS = 30;
const LOAD_MS = 15_000;
const KILL_EVERY_MS = 250;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const percentile = (replies: Reply[], p: number) => replies.map((r) => r.ms).sort((a, b) => a - b)[Math.floor(p * (replies.length - 1))] ?? 0;

interface Operation {
  kind: 'grab' | 'redeem';
  user: string;
  /** Idempotency-Key of a grab, orderNo of a redemption. */
  key: string;
  replies: Reply[];
}

/**
 * The server's own database connections killed from another session every 250 ms while clients
 * grab and redeem, each retrying with the same key or order until it gets a definite answer.
 */
describe('KILL CONNECTION of the server’s database connections during grabs and redemptions', () => {
  let fdb: FaultDatabase;
  let server: Server;
  let couponId: string;
  const operations: Operation[] = [];
  let killed = 0;
  let killRounds = 0;

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase({ appUser: true });
    server = await startServer({ dbName: fdb.name, dbUser: fdb.appUser?.name, dbPassword: fdb.appUser?.password });
    const created = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: 100_000 }) });
    expect(created.status).toBe(201);
    couponId = created.body.id as string;
  });
  afterAll(async () => {
    const replies = operations.flatMap((o) => o.replies);
    report({
      scenario: 'KILL CONNECTION during grabs and redemptions',
      requests: replies.length,
      faults: killed,
      killRounds,
      violations: (await checkInvariants(fdb.db)).length,
      acknowledgedWritesLost: lostWrites,
      answered2xx: replies.filter((r) => r.status >= 200 && r.status < 300).length,
      answered503: replies.filter((r) => r.status === 503).length,
      p50ms: percentile(replies, 0.5),
      p99ms: percentile(replies, 0.99),
    });
    await server?.stop();
    await fdb?.close();
  });
  let lostWrites = 0;

  const definite = (op: Operation, r: Reply) => r.status !== 503 && !(op.kind === 'grab' && r.status === 409 && r.body.code === 'IDEMPOTENCY_IN_PROGRESS');

  /** Retries one operation with the same key until the service gives a definite answer (at most ~10 s). */
  async function untilDefinite(op: Operation, send: () => Promise<Reply>): Promise<Reply> {
    for (let attempt = 0; ; attempt++) {
      const r = await send();
      op.replies.push(r);
      if (definite(op, r) || attempt >= 200) return r;
      await sleep(50);
    }
  }

  async function client(c: number, until: number): Promise<void> {
    for (let n = 0; Date.now() < until; n++) {
      const user = `kc${c}-${n}`;
      const grab: Operation = { kind: 'grab', user, key: `kc-${c}-${n}`, replies: [] };
      operations.push(grab);
      const g = await untilDefinite(grab, () => call(server.url, 'POST', `/coupons/${couponId}/grab`, { token: tokenFor(user), headers: { 'idempotency-key': grab.key } }));
      if (g.status !== 201) continue;
      const redeem: Operation = { kind: 'redeem', user, key: `order-${c}-${n}`, replies: [] };
      operations.push(redeem);
      await untilDefinite(redeem, () => call(server.url, 'POST', '/redemptions', { token: tokenFor(user), body: { userCouponId: g.body.id, orderNo: redeem.key, orderAmountCents: 50_000 } }));
    }
  }

  it('answers 2xx only for committed writes, the same answer on every retry, and never 500', async () => {
    const until = Date.now() + LOAD_MS;
    const killer = (async () => {
      while (Date.now() < until) {
        killed += await killConnections(fdb.admin, fdb.name, fdb.appUser?.name as string);
        killRounds++;
        await sleep(KILL_EVERY_MS);
      }
    })();
    await Promise.all([killer, ...Array.from({ length: CLIENTS }, (_, c) => client(c, until))]);
    expect(killed).toBeGreaterThan(50);

    const unexpected = operations.flatMap((op) =>
      op.replies
        .filter((r) => !(r.status === 201 || r.status === 503 || (op.kind === 'redeem' && r.status === 200) || (op.kind === 'grab' && r.status === 409 && r.body.code === 'IDEMPOTENCY_IN_PROGRESS')))
        .map((r) => `${op.kind} ${op.key}: ${r.status} ${r.error ?? ''} ${JSON.stringify(r.body)}`),
    );
    expect(unexpected).toEqual([]);
    expect(operations.filter((op) => !definite(op, op.replies[op.replies.length - 1])).map((op) => op.key)).toEqual([]);
    expect(operations.flatMap((o) => o.replies).filter((r) => r.status === 503).length).toBeGreaterThan(0);
    expect(server.child.exitCode).toBeNull();
  });

  it('every acknowledged grab and redemption is in the database, with the id every retry answered', async () => {
    const grabs = (await fdb.db.query(`SELECT id, user_id, idempotency_key FROM user_coupon WHERE coupon_id = ?`, [couponId])) as { id: string; user_id: string; idempotency_key: string }[];
    const grabByKey = new Map(grabs.map((r) => [`${r.user_id}/${r.idempotency_key}`, String(r.id)]));
    const redemptions = (await fdb.db.query(`SELECT id, order_no, user_id FROM redemption`)) as { id: string; order_no: string; user_id: string }[];
    const redemptionByOrder = new Map(redemptions.map((r) => [`${r.user_id}/${r.order_no}`, String(r.id)]));
    const wrong: string[] = [];
    for (const op of operations) {
      const ok = op.replies.filter((r) => r.status === 200 || r.status === 201);
      const ids = new Set(ok.map((r) => (op.kind === 'grab' ? r.body.id : r.body.redemptionId)));
      const stored = (op.kind === 'grab' ? grabByKey : redemptionByOrder).get(`${op.user}/${op.key}`);
      if (ids.size > 1) wrong.push(`${op.kind} ${op.key} answered different ids ${[...ids].join(',')}`);
      if (ids.size === 1 && stored !== [...ids][0]) {
        lostWrites++;
        wrong.push(`${op.kind} ${op.key} acknowledged ${[...ids][0]} but the database has ${stored}`);
      }
      if (op.kind === 'redeem' && ok.filter((r) => r.body.firstUse === true).length > 1) wrong.push(`redeem ${op.key} answered firstUse twice`);
    }
    expect(wrong).toEqual([]);
    // Every coupon that was issued belongs to a grab some client saw acknowledged.
    expect(grabs.length).toBe(operations.filter((o) => o.kind === 'grab' && o.replies.some((r) => r.status === 201)).length);
  });

  it('the pool recovers by itself: health, a new grab, and replays of everything answer at once', async () => {
    expect((await callUntilAnswered(server.url, 'GET', '/health')).status).toBe(200);
    const fresh = await callUntilAnswered(server.url, 'POST', `/coupons/${couponId}/grab`, { token: tokenFor('after-the-storm'), headers: { 'idempotency-key': 'fresh-1' } });
    expect(fresh.status).toBe(201);
    const acked = operations.filter((op) => op.replies.some((r) => r.status === 200 || r.status === 201));
    const replays = await mapConcurrent(acked, 20, (op) =>
      op.kind === 'grab'
        ? call(server.url, 'POST', `/coupons/${couponId}/grab`, { token: tokenFor(op.user), headers: { 'idempotency-key': op.key } })
        : call(server.url, 'POST', '/redemptions', {
            token: tokenFor(op.user),
            body: { userCouponId: operations.find((g) => g.kind === 'grab' && g.user === op.user)?.replies.find((r) => r.status === 201)?.body.id, orderNo: op.key, orderAmountCents: 50_000 },
          }),
    );
    const mismatched = acked.filter((op, i) => {
      const first = op.replies.find((r) => r.status === 200 || r.status === 201) as Reply;
      const r = replays[i];
      return op.kind === 'grab' ? r.status !== 201 || r.body.id !== first.body.id : r.status !== 200 || r.body.redemptionId !== first.body.redemptionId || r.body.firstUse !== false;
    });
    expect(mismatched.map((op) => op.key)).toEqual([]);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE status = 'USED'`)).toBe(await count(fdb.db, `SELECT COUNT(*) AS n FROM redemption`));
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });
});
