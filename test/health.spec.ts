import request from 'supertest';
import { DataSource } from 'typeorm';
import { startTestApp, TestApp } from './support/harness.js';
import { waitForStatement } from './support/processlist.js';

describe('/health with every connection of the pool busy', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ DB_POOL_SIZE: '2' });
  });
  afterAll(async () => {
    await t?.close();
  });

  it('answers 200 at once: a busy pool is not a database that is down', async () => {
    const pool = t.app.get(DataSource);
    const busy = [pool.query('SELECT SLEEP(3) AS busy_1'), pool.query('SELECT SLEEP(3) AS busy_2')];
    for (const name of ['busy_1', 'busy_2']) await waitForStatement(t.db, `%${name}%`);
    // The pool's third request waits for one of those two.
    const queued = pool.query('SELECT 1 AS queued');
    const started = Date.now();
    const health = await request(t.url).get('/health');
    expect([health.status, health.body.status]).toEqual([200, 'ok']);
    // Well below the 3 s a wait for one of the two would take, with room for a loaded machine.
    expect(Date.now() - started).toBeLessThan(2500);
    await Promise.all([...busy, queued]);
  });
});
