import { adminToken, serviceToken, tokenFor } from '../support/harness.js';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { CommitFate, startTcpProxy, TcpProxy } from '../support/tcp-proxy.js';
import { createFaultDatabase, FaultDatabase } from './support/db.js';
import { call, mapConcurrent, Reply } from './support/http.js';
import { report } from './support/report.js';
import { buildServer, Server, startServer } from './support/server.js';
import { couponBody } from '../support/factories.js';

const GRABS = 600;
const STOCK = 400;

/**
 * A TCP proxy between the service and MariaDB that, for a share of COMMITs, forwards the COMMIT and
 * cuts the connection before the server's OK comes back (the change committed, the service never
 * heard), or cuts it without forwarding the COMMIT (nothing committed). Every answer must match
 * the database: a 2xx is stored, and no change answered as a failure was committed.
 */
describe('lost COMMIT answers', () => {
  let fdb: FaultDatabase;
  let proxy: TcpProxy;
  let faulty = false;
  const servers: Server[] = [];
  const figures = {
    requests: 0,
    faults: 0,
    violations: 0,
    acknowledgedWritesLost: 0,
    committedAnsweredAsFailure: 0,
    answered503: 0,
    answeredOutcomeUnknown: 0,
    resolvedCommitted: 0,
    resolvedRolledBack: 0,
  };

  /**
   * A fixed cycle rather than chance, so each scenario meets both faults even when it commits only a
   * few times (a grouped burst is a handful of transactions): of every six COMMITs, one answer is
   * lost after the server got it, one is never forwarded. A transaction rerun after a drop meets a
   * passing COMMIT next, so no request runs out of retries because of the proxy alone.
   */
  let commitSeq = 0;
  /** The next COMMIT's answer is lost, whatever `faulty` says. */
  let loseNextAnswer = false;
  const fate = (): CommitFate => {
    if (loseNextAnswer) {
      loseNextAnswer = false;
      return 'lose-answer';
    }
    if (!faulty) return 'pass';
    const n = commitSeq++ % 6;
    return n === 1 ? 'lose-answer' : n === 4 ? 'drop' : 'pass';
  };

  beforeAll(async () => {
    await buildServer();
    fdb = await createFaultDatabase();
    proxy = await startTcpProxy({ host: fdb.config.DB_HOST, port: fdb.config.DB_PORT }, { onCommit: fate });
  });
  afterAll(async () => {
    faulty = false;
    figures.faults = proxy ? proxy.commits['lose-answer'] + proxy.commits.drop : 0;
    if (fdb) figures.violations = (await checkInvariants(fdb.db)).length;
    report({ scenario: 'lost COMMIT answers (grabs both strategies, redemptions)', ...figures });
    await Promise.all(servers.map((s) => s.stop()));
    await proxy?.close();
    await fdb?.close();
  });

  const start = async (strategy: string) => {
    const server = await startServer({
      dbName: fdb.name,
      env: { DB_HOST: '127.0.0.1', DB_PORT: String(proxy.port), DB_POOL_SIZE: '10', GRAB_STRATEGY: strategy },
    });
    servers.push(server);
    return server;
  };
  const resolvedOn = async (server: Server) => {
    const text = (await call(server.url, 'GET', '/metrics')).body.text as string;
    const n = (outcome: string) =>
      Number(new RegExp(`^db_commit_outcome_resolved_total\\{outcome="${outcome}"\\} (\\d+)`, 'm').exec(text)?.[1] ?? 0);
    return { committed: n('committed'), rolledBack: n('rolled_back'), unknown: n('unknown') };
  };
  const tallyFailures = (replies: Reply[]) => {
    figures.requests += replies.length;
    figures.answered503 += replies.filter((r) => r.status === 503).length;
    figures.answeredOutcomeUnknown += replies.filter((r) => r.body.code === 'OUTCOME_UNKNOWN').length;
  };

  for (const strategy of ['per-request', 'grouped']) {
    it(`grabs (${strategy}): every 201 is stored, nothing answered otherwise was issued`, async () => {
      const server = await start(strategy);
      const created = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: STOCK }) });
      expect(created.status).toBe(201);
      const couponId = created.body.id as string;
      const cutBefore = { ...proxy.commits };
      faulty = true;
      const replies = await mapConcurrent(
        Array.from({ length: GRABS }, (_, i) => i),
        60,
        (i) =>
          call(server.url, 'POST', `/coupons/${couponId}/grab`, {
            token: tokenFor(`${strategy}-${i}`),
            headers: { 'idempotency-key': `lc-${i}` },
          }),
      );
      faulty = false;
      tallyFailures(replies);
      const stored = (await fdb.db.query(`SELECT id, user_id FROM user_coupon WHERE coupon_id = ?`, [couponId])) as {
        id: string;
        user_id: string;
      }[];
      const byUser = new Map(stored.map((s) => [s.user_id, String(s.id)]));
      const wrong: string[] = [];
      replies.forEach((r, i) => {
        const mine = byUser.get(`${strategy}-${i}`);
        if (r.status === 201 && mine !== r.body.id) wrong.push(`#${i} answered 201 ${r.body.id}, stored ${mine}`);
        if (r.status === 201 && mine !== r.body.id) figures.acknowledgedWritesLost++;
        if (r.status !== 201 && mine !== undefined && r.body.code !== 'OUTCOME_UNKNOWN') {
          figures.committedAnsweredAsFailure++;
          wrong.push(`#${i} answered ${r.status} ${r.body.code} but coupon ${mine} was issued`);
        }
        if (![201, 409, 503].includes(r.status) || (r.status === 409 && r.body.code !== 'SOLD_OUT'))
          wrong.push(`#${i} unexpected ${r.status} ${r.body.code}`);
      });
      expect(wrong).toEqual([]);
      expect(stored.length).toBe(replies.filter((r) => r.status === 201).length);
      // The faults happened, and both kinds were resolved (not merely retried around).
      expect(proxy.commits['lose-answer']).toBeGreaterThan(cutBefore['lose-answer']);
      expect(proxy.commits.drop).toBeGreaterThan(cutBefore.drop);
      const resolved = await resolvedOn(server);
      figures.resolvedCommitted += resolved.committed;
      figures.resolvedRolledBack += resolved.rolledBack;
      expect(resolved.committed).toBeGreaterThan(0);
      expect(resolved.rolledBack).toBeGreaterThan(0);
      expect(resolved.unknown).toBe(0);
      expect(await checkInvariants(fdb.db)).toEqual([]);
    });
  }

  it('redemptions: every 201 is stored, no coupon answered otherwise was used', async () => {
    const server = servers[0];
    const owned = (await fdb.db.query(`SELECT id, user_id FROM user_coupon WHERE status = 'UNUSED' ORDER BY id LIMIT 300`)) as {
      id: string;
      user_id: string;
    }[];
    expect(owned.length).toBeGreaterThan(100);
    const before = await resolvedOn(server);
    faulty = true;
    const replies = await mapConcurrent(owned, 40, (uc) =>
      call(server.url, 'POST', '/redemptions', {
        token: serviceToken(),
        body: { userCouponId: uc.id, orderNo: `lc-order-${uc.id}`, orderAmountCents: 20_000, userId: uc.user_id },
      }),
    );
    faulty = false;
    tallyFailures(replies);
    const wrong: string[] = [];
    for (const [i, r] of replies.entries()) {
      const [row] = (await fdb.db.query(
        `SELECT r.id, uc.status FROM user_coupon uc LEFT JOIN redemption r ON r.user_coupon_id = uc.id WHERE uc.id = ?`,
        [owned[i].id],
      )) as { id: string | null; status: string }[];
      if (r.status === 201 && (String(row.id) !== String(r.body.redemptionId) || row.status !== 'USED')) {
        figures.acknowledgedWritesLost++;
        wrong.push(`${owned[i].id}: answered 201 ${r.body.redemptionId}, stored ${row.id} ${row.status}`);
      }
      if (r.status !== 201 && row.id !== null && r.body.code !== 'OUTCOME_UNKNOWN') {
        figures.committedAnsweredAsFailure++;
        wrong.push(`${owned[i].id}: answered ${r.status} ${r.body.code} but redemption ${row.id} was stored`);
      }
      if (r.status !== 201 && r.status !== 503) wrong.push(`${owned[i].id}: unexpected ${r.status} ${r.body.code}`);
    }
    expect(wrong).toEqual([]);
    const after = await resolvedOn(server);
    figures.resolvedCommitted += after.committed - before.committed;
    figures.resolvedRolledBack += after.rolledBack - before.rolledBack;
    expect(after.committed).toBeGreaterThan(before.committed);
    expect(after.unknown).toBe(0);
    expect(await checkInvariants(fdb.db)).toEqual([]);
  });

  it("a reconciliation trigger whose claim of the job's lease committed unheard starts its run, and leaves nothing blocking the next", async () => {
    const server = servers[0] ?? (await start('grouped'));
    loseNextAnswer = true;
    const first = await call(server.url, 'POST', '/admin/reconciliation/runs', { token: adminToken() });
    expect(loseNextAnswer).toBe(false);
    expect([first.status, first.body.runId]).toEqual([202, expect.stringMatching(/^\d+$/)]);
    for (let i = 0; ; i++) {
      const run = await call(server.url, 'GET', `/admin/reconciliation/runs/${String(first.body.runId)}`, { token: adminToken() });
      if (run.body.status !== 'RUNNING') break;
      if (i > 200) throw new Error('the run never ended');
      await new Promise((r) => setTimeout(r, 100));
    }
    const next = await call(server.url, 'POST', '/admin/reconciliation/runs', { token: adminToken() });
    expect([next.status, next.body.code]).toEqual([202, undefined]);
  });
});
