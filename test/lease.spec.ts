import { DataSource } from 'typeorm';
import { dataSourceOptions } from '../src/database/data-source-options.js';
import { acquireLease, Lease, LeaseLostError, tryAcquireLease } from '../src/database/lease.js';
import { createTestDatabase, dropTestDatabase, testConfig } from './support/harness.js';

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Each holder has a pool of its own, as separate instances have; the lease row is the only thing
 * they share.
 */
describe('job leases', () => {
  const config = testConfig();
  const pools: DataSource[] = [];
  const pool = async () => {
    const ds = new DataSource({ ...dataSourceOptions(config), poolSize: 3 });
    await ds.initialize();
    pools.push(ds);
    return ds;
  };
  let instances: DataSource[];

  beforeAll(async () => {
    await createTestDatabase(config);
    instances = [await pool(), await pool(), await pool()];
  });
  afterAll(async () => {
    await Promise.all(pools.filter((p) => p.isInitialized).map((p) => p.destroy()));
    await dropTestDatabase(config);
  });

  const holderOf = async (name: string) =>
    ((await instances[0].query(`SELECT holder FROM job_lease WHERE name = ?`, [name])) as { holder: string | null }[])[0]?.holder ?? null;

  it('three instances claiming the same lease at once: exactly one gets it, every round', async () => {
    for (let round = 0; round < 15; round++) {
      const got = await Promise.all(instances.map((ds) => tryAcquireLease(ds, 'race', { ttlMs: 10_000, retries: 3 })));
      const winners = got.filter((l): l is Lease => l !== null);
      expect(winners).toHaveLength(1);
      expect(await holderOf('race')).toBe(winners[0].holder);
      await winners[0].release();
      expect(await holderOf('race')).toBeNull();
    }
  });

  it('one waiting for a taken lease is told once who holds it and until when, and gets it when let go', async () => {
    const first = (await tryAcquireLease(instances[0], 'told', { ttlMs: 10_000, retries: 3 })) as Lease;
    const told: [string | null, Date][] = [];
    const waiting = acquireLease(instances[1], 'told', { ttlMs: 10_000, retries: 3 }, 5_000, (holder, until) => told.push([holder, until]));
    await sleep(600);
    await first.release();
    const second = await waiting;
    expect(told).toEqual([[first.holder, expect.any(Date)]]);
    expect(told[0][1].getTime()).toBeGreaterThan(Date.now());
    await second.release();
  });

  it('jobs looping on three instances never overlap, and each instance gets turns', async () => {
    const intervals: { who: number; from: number; to: number }[] = [];
    const until = Date.now() + 3000;
    await Promise.all(
      instances.map(async (ds, who) => {
        while (Date.now() < until) {
          const lease = await tryAcquireLease(ds, 'loop', { ttlMs: 5000, retries: 3 });
          if (lease) {
            const from = performance.now();
            await sleep(20 + Math.random() * 30);
            intervals.push({ who, from, to: performance.now() });
            await lease.release();
          }
          await sleep(Math.random() * 20);
        }
      }),
    );
    intervals.sort((a, b) => a.from - b.from);
    for (let i = 1; i < intervals.length; i++) expect(intervals[i].from).toBeGreaterThanOrEqual(intervals[i - 1].to);
    expect(intervals.length).toBeGreaterThan(10);
    expect(new Set(intervals.map((i) => i.who)).size).toBe(3);
  });

  it('a running holder keeps its lease past the lease time by renewing it', async () => {
    // A lease time of 3 s: a renewal (every 1 s) delayed by a busy machine must not let it run out.
    const lease = await tryAcquireLease(instances[0], 'renewed', { ttlMs: 3000, retries: 3 });
    expect(lease).not.toBeNull();
    await sleep(7500);
    expect(await tryAcquireLease(instances[1], 'renewed', { ttlMs: 3000, retries: 3 })).toBeNull();
    expect(lease?.signal.aborted).toBe(false);
    await lease?.release();
    expect(await tryAcquireLease(instances[1], 'renewed', { ttlMs: 3000, retries: 3 })).not.toBeNull();
  });

  it('a holder that dies (its renewals stop) is taken over once its lease expires, not before', async () => {
    const doomed = await pool();
    // Taken before the lease is asked for: its expiry counts from a moment after this.
    const diedAt = Date.now();
    const dead = await tryAcquireLease(doomed, 'takeover', { ttlMs: 1500, retries: 3 });
    expect(dead).not.toBeNull();
    // Its connections are gone: from the database's side the holder is dead.
    await doomed.destroy();
    let taken: Lease | null = null;
    while (!taken) {
      taken = await tryAcquireLease(instances[1], 'takeover', { ttlMs: 1500, retries: 3 });
      if (!taken) await sleep(50);
    }
    const waited = Date.now() - diedAt;
    expect(waited).toBeGreaterThanOrEqual(1000);
    expect(waited).toBeLessThan(5000);
    expect(await holderOf('takeover')).toBe(taken.holder);
    // The dead holder finds out by itself: its renewals failed past the lease time.
    for (const deadline = Date.now() + 5000; !dead?.signal.aborted && Date.now() < deadline;) await sleep(20);
    expect(dead?.signal.aborted).toBe(true);
    expect(dead?.signal.reason).toBeInstanceOf(LeaseLostError);
    await taken.release();
  });

  it('a holder that stalled past its lease sees it lost at its next renewal (signal aborted)', async () => {
    const stalled = await tryAcquireLease(instances[0], 'stall', { ttlMs: 900, retries: 3 });
    expect(stalled).not.toBeNull();
    // As if it had stopped renewing for a while and another instance had taken the expired lease.
    await instances[2].query(
      `UPDATE job_lease SET holder = 'another-instance', expires_at = NOW(3) + INTERVAL 60 SECOND WHERE name = 'stall'`,
    );
    // Renewals come every third of the lease (300 ms); a loaded machine may be late with the next.
    for (const deadline = Date.now() + 5000; !stalled?.signal.aborted && Date.now() < deadline;) await sleep(20);
    expect(stalled?.signal.aborted).toBe(true);
    expect(String((stalled?.signal.reason as Error).message)).toMatch(/another holder/);
    // Its release does not free the lease it no longer holds.
    await stalled?.release();
    expect(await holderOf('stall')).toBe('another-instance');
  });
});
