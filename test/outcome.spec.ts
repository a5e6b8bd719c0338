import request from 'supertest';
import { DataSource, QueryRunner } from 'typeorm';
import { setTimeout as sleep } from 'node:timers/promises';
import { runWithDeadline } from '../src/database/deadline-pool.js';
import { inSnapshot, TransactionService } from '../src/database/transaction.service.js';
import { createCoupon, newKey } from './support/factories.js';
import { bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { CommitFate, startTcpProxy, TcpProxy } from './support/tcp-proxy.js';

const real = { host: process.env.DB_HOST ?? '127.0.0.1', port: Number(process.env.DB_PORT ?? 3306) };

/** `fate` for the first COMMIT after arm(), calling `then` as it happens; every other COMMIT passes. */
function nextCommit(fate: CommitFate, then = () => {}) {
  let armed = false;
  return {
    arm: () => (armed = true),
    onCommit: (): CommitFate => {
      if (!armed) return 'pass';
      armed = false;
      then();
      return fate;
    },
  };
}

/** When the COMMIT's answer is lost and the database then stays out of reach, the answer says the outcome is unknown. */
describe('a lost COMMIT with the database unreachable', () => {
  let proxy: TcpProxy;
  let t: TestApp;
  /** The armed COMMIT is cut before it reaches the server, and the "host" dies with it: nothing answers until it is back. */
  const { arm, onCommit } = nextCommit('drop', () => void proxy.close());

  beforeAll(async () => {
    proxy = await startTcpProxy(real, { onCommit });
    t = await startTestApp({ DB_HOST: '127.0.0.1', DB_PORT: String(proxy.port), OUTCOME_RESOLVE_MS: '1000', DB_POOL_SIZE: '4' });
  });
  afterAll(async () => {
    await t.close();
    await proxy.close();
  });

  it('answers 503 OUTCOME_UNKNOWN naming the key after OUTCOME_RESOLVE_MS; once the database is back, the key tells the truth', async () => {
    const { id: couponId } = await createCoupon(t.url, { totalStock: 5 });
    const key = newKey('unknown');
    const grab = () =>
      request(t.url)
        .post(`/coupons/${couponId}/grab`)
        .set(bearer(tokenFor('unlucky')))
        .set('Idempotency-Key', key);
    const port = proxy.port;
    arm();
    const started = Date.now();
    const res = await grab();
    expect(res.status).toBe(503);
    expect(res.body).toMatchObject({ code: 'OUTCOME_UNKNOWN', details: { idempotencyKey: key, lookup: `GET /grabs/${key}` } });
    expect(Date.now() - started).toBeGreaterThanOrEqual(1000);
    expect(Date.now() - started).toBeLessThan(10_000);

    proxy = await startTcpProxy(real, { onCommit, port });
    const metrics = (await request(t.url).get('/metrics')).text;
    expect(metrics).toMatch(/^db_commit_outcome_resolved_total\{outcome="unknown"\} [1-9]/m);
    // It was dropped before the server saw it: not committed, and the retry issues the coupon.
    let lookup = await request(t.url)
      .get(`/grabs/${key}`)
      .set(bearer(tokenFor('unlucky')));
    for (let i = 0; i < 20 && lookup.status === 503; i++) {
      await new Promise((r) => setTimeout(r, 250));
      lookup = await request(t.url)
        .get(`/grabs/${key}`)
        .set(bearer(tokenFor('unlucky')));
    }
    expect(lookup.status).toBe(404);
    expect((await grab()).status).toBe(201);
  });
});

describe('a COMMIT answered after the last moment its request left it', () => {
  let proxy: TcpProxy;
  let t: TestApp;
  const { arm, onCommit } = nextCommit('slow-answer');

  beforeAll(async () => {
    proxy = await startTcpProxy(real, { onCommit, slowAnswerMs: 400 });
    t = await startTestApp({ DB_HOST: '127.0.0.1', DB_PORT: String(proxy.port) });
  });
  afterAll(async () => {
    await t.close();
    await proxy.close();
  });

  it('is found committed in the margin left for the answer, not answered OUTCOME_UNKNOWN', async () => {
    const { id } = await createCoupon(t.url, { name: 'before' });
    // The request's database time ends 250 ms before its deadline; the COMMIT is sent with 100 ms of
    // it left, and its answer (the server has committed) comes 400 ms later.
    const deadline = { at: Date.now() + 1500, answered: false };
    arm();
    const outcome = await runWithDeadline(deadline, () =>
      t.app.get(TransactionService).inTransaction(async (em) => {
        await em.query('UPDATE coupon SET name = ? WHERE id = ?', ['after', id]);
        await sleep(deadline.at - 250 - 100 - Date.now());
        return 'returned';
      }),
    ).catch((err: { code?: string }) => err.code);
    expect([outcome, proxy.commits['slow-answer']]).toEqual(['returned', 1]);
    expect(((await t.db.query('SELECT name FROM coupon WHERE id = ?', [id])) as { name: string }[])[0].name).toBe('after');
  });
});

describe("the app's transactions (TransactionService)", () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  it('gets a row per connection from write transactions, and rows idle for a day go at start-up', async () => {
    const { id: couponId } = await createCoupon(t.url, { totalStock: 5 });
    const res = await request(t.url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor('stamped')))
      .set('Idempotency-Key', newKey('s'));
    expect(res.status).toBe(201);
    const fresh = (await t.db.query(`SELECT slot FROM tx_marker`)) as { slot: string }[];
    expect(fresh.length).toBeGreaterThan(0);
    await t.db.query(
      `INSERT INTO tx_marker (slot, tx_id, updated_at) VALUES ('gone-long-ago', REPEAT('0', 32), NOW(3) - INTERVAL 25 HOUR)`,
    );
    await t.app.get(TransactionService).onApplicationBootstrap();
    const left = (await t.db.query(`SELECT slot FROM tx_marker`)) as { slot: string }[];
    expect(left.map((r) => r.slot).sort()).toEqual(fresh.map((r) => r.slot).sort());
  });

  // Their session is READ COMMITTED (deadline-pool.ts) and they send no level of their own: this holds the two together.
  it('are READ COMMITTED: a second read sees what another transaction committed after the first', async () => {
    const { id } = await createCoupon(t.url, { name: 'before' });
    const seen = await t.app.get(TransactionService).inTransaction(async (em) => {
      const read = async () => ((await em.query('SELECT name FROM coupon WHERE id = ?', [id])) as { name: string }[])[0].name;
      const first = await read();
      await t.db.query('UPDATE coupon SET name = ? WHERE id = ?', ['after', id]);
      return [first, await read()];
    });
    expect(seen).toEqual(['before', 'after']);
  });

  it('snapshots see one moment, and a connection whose snapshot failed to begin or end is closed, not handed on', async () => {
    const { id } = await createCoupon(t.url, { name: 'before' });
    const app = t.app.get(DataSource);
    const nameOf = async (q: QueryRunner) => ((await q.query('SELECT name FROM coupon WHERE id = ?', [id])) as { name: string }[])[0].name;
    const threadOf = (q: QueryRunner) => (q as unknown as { databaseConnection: { threadId: number } }).databaseConnection.threadId;
    const alive = async (thread: number) => {
      for (const until = Date.now() + 5000; Date.now() < until; await new Promise((r) => setTimeout(r, 50))) {
        const [{ n }] = (await t.db.query('SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = ?', [thread])) as {
          n: string;
        }[];
        if (n === '0') return false;
      }
      return true;
    };
    /** A snapshot on a connection of its own whose statement `failing` (if any) fails as a dropped network would. */
    const snapshot = async (failing?: string) => {
      const q = app.createQueryRunner();
      await q.connect();
      const thread = threadOf(q);
      const query = q.query.bind(q);
      q.query = ((sql: string, ...rest: unknown[]) =>
        failing && sql.startsWith(failing) ? Promise.reject(new Error(`${failing} lost`)) : query(sql, ...(rest as []))) as typeof q.query;
      const seen = await inSnapshot(q, async () => {
        const first = await nameOf(q);
        await t.db.query('UPDATE coupon SET name = ? WHERE id = ?', [`${first}+`, id]);
        return [first, await nameOf(q)];
      }).catch((err: Error) => err.message);
      await q.release();
      return { seen, thread };
    };
    const ok = await snapshot();
    expect(ok.seen).toEqual(['before', 'before']);
    expect(await alive(ok.thread)).toBe(true);
    // The level set for the snapshot would apply to the connection's next transaction, a write's.
    const unstarted = await snapshot('START TRANSACTION');
    expect([unstarted.seen, await alive(unstarted.thread)]).toEqual(['START TRANSACTION lost', false]);
    // The reads are whole; only the snapshot would stay open.
    const uncommitted = await snapshot('COMMIT');
    expect([uncommitted.seen, await alive(uncommitted.thread)]).toEqual([['before+', 'before+'], false]);
  });
});
