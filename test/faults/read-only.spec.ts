import { tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { databaseFingerprint } from '../support/fingerprint.js';
import type { FaultDatabase } from './support/db.js';
import { call, percentile, Reply, sleep } from './support/http.js';
import { report } from './support/report.js';
import type { Server } from './support/server.js';
import { GrabAndRedeemWorkload, startGrabAndRedeem } from './support/workload.js';

const CLIENTS = 20;
const READERS = 4;
const LOAD_MS = 12_000;
const READ_ONLY_AFTER_MS = 3000;
const READ_ONLY_FOR_MS = 4000;

/**
 * MariaDB made read-only (SET GLOBAL read_only = 1) for four seconds in the middle of grabs,
 * redemptions and reads, then writable again. The server connects with an account of its own
 * without SUPER, which read_only applies to; everyone else on this MariaDB connects as root and
 * is not affected. read_only is put back to 0 in `finally` and again in afterAll whatever happens.
 */
describe('MariaDB read-only during load', () => {
  let fdb: FaultDatabase;
  let server: Server;
  let load: GrabAndRedeemWorkload;
  const reads: Reply[] = [];
  const window = { on: 0, offRequested: 0, off: 0 };
  let lostWrites = 0;

  const setReadOnly = async (on: boolean) => {
    await fdb.admin.query(`SET GLOBAL read_only = ${on ? 1 : 0}`);
  };

  beforeAll(async () => {
    ({ fdb, server, load } = await startGrabAndRedeem('ro'));
  });
  afterAll(async () => {
    await fdb?.admin.query('SET GLOBAL read_only = 0');
    const replies = load.replies();
    report({
      scenario: 'read_only during load',
      requests: replies.length + reads.length,
      faults: 1,
      readOnlyMs: window.off - window.on,
      violations: (await checkInvariants(fdb.db)).length,
      acknowledgedWritesLost: lostWrites,
      answered503: replies.filter((r) => r.status === 503).length,
      p99ms: percentile(replies, 0.99),
    });
    await server?.stop();
    await fdb?.close();
  });

  async function reader(r: number, until: number): Promise<void> {
    while (Date.now() < until) {
      const path = r % 2 === 0 ? `/coupons/${load.couponId}` : '/me/coupons?limit=5';
      reads.push(await call(server.url, 'GET', path, { token: tokenFor(`ro${r}-0`) }));
      await sleep(20);
    }
  }

  it('refuses writes with 503 while read-only, keeps answering reads, and writes again by itself', async () => {
    const until = Date.now() + LOAD_MS;
    const outage = (async () => {
      await sleep(READ_ONLY_AFTER_MS);
      try {
        await setReadOnly(true);
        window.on = Date.now();
        const frozen = await databaseFingerprint(fdb.db);
        await sleep(READ_ONLY_FOR_MS);
        // Nothing at all was written while the database refused writes.
        expect(await databaseFingerprint(fdb.db)).toEqual(frozen);
      } finally {
        window.offRequested = Date.now();
        await setReadOnly(false);
        window.off = Date.now();
      }
    })();
    await Promise.all([
      outage,
      ...Array.from({ length: CLIENTS }, (_, c) => load.client(c, until)),
      ...Array.from({ length: READERS }, (_, r) => reader(r, until)),
    ]);

    expect(load.unexpected()).toEqual([]);
    expect(load.undecided()).toEqual([]);
    // Every write sent after read_only was on and answered before it was switched off was a 503 with Retry-After.
    const inside = load.operations
      .flatMap((op) => op.replies.map((reply) => ({ op, reply })))
      .filter(({ reply }) => reply.sentAt >= window.on && reply.sentAt + reply.ms <= window.offRequested);
    expect(inside.length).toBeGreaterThan(0);
    expect(
      inside
        .filter(
          ({ reply }) => reply.status !== 503 || reply.body.code !== 'SERVICE_UNAVAILABLE' || reply.headers['retry-after'] === undefined,
        )
        .map(({ op, reply }) => `${op.kind} ${op.key}: ${reply.status}`),
    ).toEqual([]);
    // Reads never needed the database to be writable.
    expect(reads.length).toBeGreaterThan(0);
    expect(reads.filter((r) => r.status !== 200).map((r) => `${r.status} ${JSON.stringify(r.body)}`)).toEqual([]);
    // Writes came back without a restart: some write sent after read_only was lifted succeeded.
    const after = load.operations.flatMap((op) => op.replies).filter((r) => r.sentAt >= window.off);
    expect(after.some((r) => r.status === 201)).toBe(true);
    expect(server.child.exitCode).toBeNull();
  });

  it('nothing partial: every acknowledged write is stored once, every replay answers the same, invariants hold', async () => {
    const { wrong, lostWrites: lost } = await load.verify(fdb.db);
    lostWrites = lost;
    expect(wrong).toEqual([]);
    expect(await load.replayAcknowledged()).toEqual([]);
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });
});
