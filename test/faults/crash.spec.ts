import { couponBody } from '../support/factories.js';
import { adminToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { count, createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, callUntilAnswered, mapConcurrent, Reply } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';

const GRABS = 2000;
const STOCK = 1500;
/** Grabs in flight at once: the shoppers of the flood, each grabbing again as soon as answered. */
const CONNECTIONS = 250;

interface Attempt {
  user: string;
  key: string;
  reply: Reply;
}

/**
 * kill -9 of the server during a flood of 2,000 grabs (250 in flight at a time), then a restart on the same database.
 * Jepsen's set workload: every acknowledged grab must be there; every grab whose answer was lost
 * must be resolvable by GET /grabs/:key to exactly one coupon or none; nothing else may exist.
 */
describe('kill -9 during a flood of 2,000 grabs', () => {
  let fdb: FaultDatabase;
  let server: Server | undefined;
  const figures = { requests: 0, faults: 0, violations: 0, acknowledgedWritesLost: 0, acknowledged: 0, answerLost: 0, lostButIssued: 0 };

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
  });
  afterAll(async () => {
    report({ scenario: 'kill -9 during grabs', ...figures });
    await server?.stop();
    await fdb?.close();
  });

  /**
   * 2,000 grabs as CONNECTIONS shoppers each pressing again once answered, and kill -9 when
   * `killAfter` answers have come back; no grab is sent after that. A group's answers leave the server
   * together, so with all 2,000 in flight at once the kill could come after the last group was
   * answered (seen: a 1,200-answer trigger found nothing left to cut). With at most CONNECTIONS in
   * flight, the server can be at most that far ahead of the count, and grabs sent in reply to the
   * answers before the trigger are still in flight when it fires.
   */
  async function grabsWithCrash(couponId: string, round: string, killAfter: number): Promise<Attempt[]> {
    let answered = 0;
    let crashing: Promise<void> | undefined;
    const current = server as Server;
    const attempts = await mapConcurrent(
      Array.from({ length: GRABS }, (_, i) => i),
      CONNECTIONS,
      async (i): Promise<Attempt> => {
        const user = `${round}-u${i}`;
        const key = `${round}-k${i}`;
        const reply = await call(current.url, 'POST', `/coupons/${couponId}/grab`, {
          token: tokenFor(user),
          headers: { 'idempotency-key': key },
          timeoutMs: 30_000,
        });
        if (reply.status !== 0 && ++answered === killAfter) crashing = current.crash();
        return { user, key, reply };
      },
      () => crashing !== undefined,
    );
    await crashing;
    figures.requests += attempts.length;
    figures.faults++;
    return attempts;
  }

  it.each([
    ['early', 100],
    ['late', 1200],
  ])(
    'a crash %s in the flood loses no acknowledged grab, and every lost answer resolves to one coupon or none',
    async (round, killAfter) => {
      server = await startServer({ dbName: fdb.name });
      const created = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: STOCK }) });
      expect(created.status).toBe(201);
      const couponId = created.body.id as string;

      const attempts = await grabsWithCrash(couponId, round, killAfter);
      const acked = attempts.filter((a) => a.reply.status === 201);
      const refused = attempts.filter((a) => a.reply.status >= 400 && a.reply.status < 500);
      // No answer, or 503 (the connection to the database went with the crash): the client cannot know, and asks GET /grabs/:key.
      const lost = attempts.filter((a) => a.reply.status === 0 || a.reply.status === 503);
      // The crash must have cut the flood: some answers came, some were lost.
      expect(acked.length).toBeGreaterThan(0);
      expect(lost.length).toBeGreaterThan(0);
      expect(attempts.filter((a) => a.reply.status >= 500 && a.reply.status !== 503)).toEqual([]);
      expect(refused.every((a) => a.reply.body.code === 'SOLD_OUT')).toBe(true);

      const restarted = await startServer({ dbName: fdb.name });
      server = restarted;
      const rows = (await fdb.db.query(`SELECT id, user_id, idempotency_key FROM user_coupon WHERE coupon_id = ?`, [couponId])) as {
        id: string;
        user_id: string;
        idempotency_key: string;
      }[];
      const byKey = new Map(rows.map((r) => [`${r.user_id}/${r.idempotency_key}`, String(r.id)]));

      const missing = acked.filter((a) => byKey.get(`${a.user}/${a.key}`) !== a.reply.body.id);
      figures.acknowledgedWritesLost += missing.length;
      expect(missing.map((a) => a.key)).toEqual([]);
      expect(refused.filter((a) => byKey.has(`${a.user}/${a.key}`)).map((a) => a.key)).toEqual([]);

      const lookups = await mapConcurrent(lost, 50, (a) =>
        callUntilAnswered(restarted.url, 'GET', `/grabs/${a.key}`, { token: tokenFor(a.user) }),
      );
      figures.requests += lookups.length;
      let lostButIssued = 0;
      const unresolved: string[] = [];
      lost.forEach((a, i) => {
        const found = lookups[i];
        const inDb = byKey.get(`${a.user}/${a.key}`);
        if (found.status === 200 && found.body.id === inDb && found.body.couponId === couponId) lostButIssued++;
        else if (!(found.status === 404 && found.body.code === 'GRAB_NOT_FOUND' && inDb === undefined))
          unresolved.push(`${a.key}: ${found.status} ${JSON.stringify(found.body)} db=${inDb}`);
      });
      expect(unresolved).toEqual([]);
      // Nothing in the database that no client was told about or can find.
      expect(rows.length).toBe(acked.length + lostButIssued);
      expect(await count(fdb.db, `SELECT stock AS n FROM coupon_stock WHERE coupon_id = ?`, [couponId])).toBe(STOCK - rows.length);

      // A client retrying a lost grab with its key gets the coupon it already has, or a fresh answer.
      const retries = await mapConcurrent(lost, 50, (a) =>
        call(restarted.url, 'POST', `/coupons/${couponId}/grab`, { token: tokenFor(a.user), headers: { 'idempotency-key': a.key } }),
      );
      figures.requests += retries.length;
      lost.forEach((a, i) => {
        const inDb = byKey.get(`${a.user}/${a.key}`);
        const r = retries[i];
        if (inDb)
          expect({ key: a.key, status: r.status, id: r.body.id, replayed: r.headers['idempotent-replayed'] }).toEqual({
            key: a.key,
            status: 201,
            id: inDb,
            replayed: 'true',
          });
        else expect([201, 409]).toContain(r.status);
      });
      const violations = await checkInvariants(fdb.db);
      figures.violations += violations.length;
      figures.acknowledged += acked.length;
      figures.answerLost += lost.length;
      figures.lostButIssued += lostButIssued;
      expect(violations).toEqual([]);
      await restarted.stop();
      server = undefined;
    },
  );
});
