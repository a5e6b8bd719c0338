import { tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { count, FaultDatabase, killConnections } from './support/db.js';
import { call, callUntilAnswered, percentile, sleep } from './support/http.js';
import { report } from './support/report.js';
import type { Server } from './support/server.js';
import { GrabAndRedeemWorkload, startGrabAndRedeem } from './support/workload.js';

const CLIENTS = 30;
const LOAD_MS = 15_000;
const KILL_EVERY_MS = 250;

/**
 * The server's own database connections killed from another session every 250 ms while clients
 * grab and redeem, each retrying with the same key or order until it gets a definite answer.
 */
describe('KILL CONNECTION of the server’s database connections during grabs and redemptions', () => {
  let fdb: FaultDatabase;
  let server: Server;
  let load: GrabAndRedeemWorkload;
  let killed = 0;
  let lostWrites = 0;

  beforeAll(async () => {
    ({ fdb, server, load } = await startGrabAndRedeem('kc'));
  });
  afterAll(async () => {
    const replies = load.replies();
    report({
      scenario: 'KILL CONNECTION during grabs and redemptions',
      requests: replies.length,
      faults: killed,
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

  it('answers 2xx only for committed writes, the same answer on every retry, and never 500', async () => {
    const until = Date.now() + LOAD_MS;
    const killer = (async () => {
      while (Date.now() < until) {
        killed += await killConnections(fdb.admin, fdb.name, fdb.appUser?.name as string);
        await sleep(KILL_EVERY_MS);
      }
    })();
    await Promise.all([killer, ...Array.from({ length: CLIENTS }, (_, c) => load.client(c, until))]);
    expect(killed).toBeGreaterThan(50);
    expect(load.unexpected()).toEqual([]);
    expect(load.undecided()).toEqual([]);
    expect(load.replies().filter((r) => r.status === 503).length).toBeGreaterThan(0);
    expect(server.child.exitCode).toBeNull();
  });

  it('every acknowledged grab and redemption is in the database, with the id every retry answered', async () => {
    const { wrong, lostWrites: lost } = await load.verify(fdb.db);
    lostWrites = lost;
    expect(wrong).toEqual([]);
  });

  it('the pool recovers by itself: health, a new grab, and replays of everything answer at once', async () => {
    expect((await callUntilAnswered(server.url, 'GET', '/health')).status).toBe(200);
    const fresh = await call(server.url, 'POST', `/coupons/${load.couponId}/grab`, {
      token: tokenFor('after-the-storm'),
      headers: { 'idempotency-key': 'fresh-1' },
    });
    expect(fresh.status).toBe(201);
    expect(await load.replayAcknowledged()).toEqual([]);
    expect(await count(fdb.db, `SELECT COUNT(*) AS n FROM user_coupon WHERE status = 'USED'`)).toBe(
      await count(fdb.db, `SELECT COUNT(*) AS n FROM redemption`),
    );
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });
});
