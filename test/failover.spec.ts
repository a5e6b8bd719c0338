import request from 'supertest';
import { ConfigError, databaseHosts, loadConfig } from '../src/config/app-config.js';
import { createCoupon, newKey } from './support/factories.js';
import { bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { checkInvariants } from '../src/ledger/invariants.js';
import { freePort } from './support/net.js';
import { startTcpProxy, TcpProxy } from './support/tcp-proxy.js';

const real = { host: process.env.DB_HOST ?? '127.0.0.1', port: Number(process.env.DB_PORT ?? 3306) };
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

describe('DB_HOSTS', () => {
  it('is validated at boot: host:port entries, ports in range, no repeats', () => {
    for (const bad of ['db1', 'db1:', ':3306', 'db1:3306,', 'db1:3306;db2:3306', 'db 1:3306', 'db1:0', 'db1:70000', 'db1:3306,db1:3306']) {
      expect(() => loadConfig({ DB_HOSTS: bad })).toThrow(ConfigError);
    }
    expect(databaseHosts(loadConfig({ DB_HOSTS: 'db1:3306,10.0.0.2:3307' }))).toEqual([
      { host: 'db1', port: 3306 },
      { host: '10.0.0.2', port: 3307 },
    ]);
    expect(databaseHosts(loadConfig({ DB_HOST: 'solo', DB_PORT: '3310' }))).toEqual([{ host: 'solo', port: 3310 }]);
  });

  it('starts on the next host when the first refuses connections', async () => {
    const t = await startTestApp({ DB_HOSTS: `127.0.0.1:${await freePort()},${real.host}:${real.port}` });
    try {
      expect((await request(t.url).get('/health')).status).toBe(200);
    } finally {
      await t.close();
    }
  });

  describe('when the host in use dies', () => {
    let proxy: TcpProxy;
    let t: TestApp;
    beforeAll(async () => {
      // The proxy stands for the first host: closing it is that host dying.
      proxy = await startTcpProxy(real);
      t = await startTestApp({ DB_HOSTS: `127.0.0.1:${proxy.port},${real.host}:${real.port}`, DB_POOL_SIZE: '4' });
    });
    afterAll(async () => {
      await t.close();
      await proxy.close();
    });

    it('moves to the next host within seconds; every answer is a 201 or an honest 503, and the 201s are stored', async () => {
      const { id: couponId } = await createCoupon(t.url, { totalStock: 10_000 });
      const grab = (i: number) =>
        request(t.url)
          .post(`/coupons/${couponId}/grab`)
          .set(bearer(tokenFor(`fo-${i}`)))
          .set('Idempotency-Key', newKey('fo'));
      expect((await grab(0)).status).toBe(201);
      expect(proxy.accepted).toBeGreaterThan(0);

      await proxy.close();
      const cutAt = Date.now();
      const statuses: number[] = [];
      let firstOkAfterCut: number | null = null;
      for (let i = 1; Date.now() - cutAt < 8000 && (firstOkAfterCut === null || statuses.length < 50); i++) {
        const res = await grab(i);
        statuses.push(res.status);
        if (res.status === 201 && firstOkAfterCut === null) firstOkAfterCut = Date.now() - cutAt;
        if (res.status !== 201) await sleep(50);
      }
      expect(statuses.every((s) => s === 201 || s === 503)).toBe(true);
      expect(firstOkAfterCut).not.toBeNull();
      expect(firstOkAfterCut).toBeLessThan(5000);
      // Once moved, it stays on the live host.
      expect(statuses.slice(-20).every((s) => s === 201)).toBe(true);
      const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ?`, [couponId])) as { n: string }[];
      expect(Number(n)).toBe(1 + statuses.filter((s) => s === 201).length);
      expect((await request(t.url).get('/health')).status).toBe(200);
      expect(await checkInvariants(t.db)).toEqual([]);
    });
  });
});
