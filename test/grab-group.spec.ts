import { registry } from '../src/common/metrics.js';
import { CouponService } from '../src/coupon/coupon.service.js';
import type { Coupon } from '../src/coupon/coupon.entity.js';
import type { GrabDecision } from '../src/coupon/grab-decision.js';
import { GrabGroupService } from '../src/coupon/grab-group.service.js';
import { withDeadline } from '../src/database/deadline-pool.js';
import { IssueService } from '../src/ledger/issue.service.js';
import { createCoupon, newKey } from './support/factories.js';
import { checkInvariantsAfterEach } from './support/scoped-invariants.js';
import { startTestApp, TestApp } from './support/harness.js';
import { waitForStatement } from './support/processlist.js';

/**
 * How grouped grabs are gathered (issue 9): bounded by GRAB_GROUP_MAX, a burst in one event-loop
 * turn forms one group, and GRAB_GROUP_WAIT_MS holds an idle coupon's first grab for company. A
 * group's coupons share one issue time (one `now` per group), which is how the groups are seen here.
 */
describe.each([
  { max: 40, waitMs: 0 },
  { max: 1000, waitMs: 300 },
])('grab groups (GRAB_GROUP_MAX=$max, GRAB_GROUP_WAIT_MS=$waitMs)', ({ max, waitMs }) => {
  let t: TestApp;
  let groups: GrabGroupService;
  let coupons: CouponService;
  beforeAll(async () => {
    t = await startTestApp({ GRAB_STRATEGY: 'grouped', GRAB_GROUP_MAX: String(max), GRAB_GROUP_WAIT_MS: String(waitMs) });
    groups = t.app.get(GrabGroupService);
    coupons = t.app.get(CouponService);
  });
  checkInvariantsAfterEach(() => t.db);
  afterAll(() => t.close());

  /** Sizes of the groups that issued this coupon's coupons, in issue order. */
  const groupSizes = async (couponId: string) =>
    (
      (await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? GROUP BY issued_at ORDER BY issued_at`, [couponId])) as {
        n: string;
      }[]
    ).map((r) => Number(r.n));
  const granted = (d: GrabDecision) => (d.outcome === 'refused' ? d.error.code : 'GRANTED');
  /**
   * Runs `fn` while another transaction holds the coupon's stock row, as a stalled group would.
   * `submitBy(ms, user)` grabs under a request deadline `ms` away and gives the outcome's code;
   * `release()` commits the hold.
   */
  const withStockHeld = async (
    coupon: Coupon,
    fn: (submitBy: (ms: number, userId: string) => Promise<string>, release: () => Promise<void>) => Promise<void>,
  ) => {
    const blocker = t.db.createQueryRunner();
    await blocker.connect();
    await blocker.startTransaction('READ COMMITTED');
    try {
      await blocker.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ? FOR UPDATE`, [coupon.id]);
      const submitBy = (ms: number, userId: string) => {
        let d!: Promise<GrabDecision>;
        withDeadline({ at: Date.now() + ms, answered: false }, () => (d = groups.submit(coupon, { userId, key: newKey() })));
        return d.then(granted, (err: { code?: string }) => err.code ?? 'ERROR');
      };
      await fn(submitBy, () => blocker.commitTransaction());
    } finally {
      if (blocker.isTransactionActive) await blocker.rollbackTransaction();
      await blocker.release();
    }
  };
  /** Until the group's INSERT is running, which it cannot finish while the held key is uncommitted (at most 10 s). */
  const waitForBlockedInsert = async () => {
    for (let i = 0; i < 200; i++) {
      const [{ n }] = (await t.db.query(
        `SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO user_coupon %both-coupons%'`,
      )) as { n: string }[];
      if (Number(n) > 0) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error('the group never tried to insert the held key');
  };

  it('splits a burst submitted in one event-loop turn into groups of at most GRAB_GROUP_MAX, in arrival order', async () => {
    const coupon = await coupons.template((await createCoupon(t.url, { totalStock: 100 })).id);
    const users = Array.from({ length: 130 }, (_, i) => `burst-${i}`);
    // Submitted within one event-loop turn but at different promise depths, as requests that went
    // through guards and pipes of different lengths reach the service.
    const arrived: string[] = [];
    const submitAfter = async (hops: number, userId: string): Promise<[string, string]> => {
      for (let i = 0; i < hops; i++) await null;
      arrived.push(userId);
      return [userId, granted(await groups.submit(coupon, { userId, key: newKey() }))];
    };
    const outcome = new Map(await Promise.all(users.map((userId, i) => submitAfter(i % 7, userId))));

    // The first 100 arrivals got the coupons; the rest were told sold out.
    expect(arrived.map((u) => outcome.get(u))).toEqual([...Array(100).fill('GRANTED'), ...Array(30).fill('SOLD_OUT')]);
    expect(await groupSizes(coupon.id)).toEqual(max === 40 ? [40, 40, 20] : [100]);
  });

  it("stores the instants of a group's coupons and their log rows as the answers carry them, and counts each issuance once", async () => {
    const coupon = await coupons.template((await createCoupon(t.url, { totalStock: 30 })).id);
    const issuances = async () =>
      (await registry.getSingleMetric('user_coupon_transitions_total')?.get())?.values.find(
        (v) => v.labels.from === 'null' && v.labels.to === 'UNUSED',
      )?.value ?? 0;
    const before = await issuances();
    const decisions = await Promise.all(
      Array.from({ length: 30 }, (_, i) => groups.submit(coupon, { userId: `instants-${i}`, key: newKey() })),
    );
    const rows = (await t.db.query(
      `SELECT uc.id, uc.issued_at, uc.valid_from, uc.expires_at, uc.updated_at, l.created_at
       FROM user_coupon uc JOIN user_coupon_state_log l ON l.user_coupon_id = uc.id WHERE uc.coupon_id = ?`,
      [coupon.id],
    )) as { id: string; issued_at: Date; valid_from: Date; expires_at: Date; updated_at: Date; created_at: Date }[];
    const stored = new Map(rows.map((r) => [String(r.id), [r.issued_at, r.valid_from, r.expires_at, r.updated_at, r.created_at]]));
    expect(stored.size).toBe(30);
    for (const d of decisions) {
      if (d.outcome !== 'granted') throw new Error(`not granted: ${granted(d)}`);
      const uc = d.userCoupon;
      expect(stored.get(uc.id)?.map((x) => x.toISOString())).toEqual(
        [uc.issuedAt, uc.validFrom, uc.expiresAt, uc.updatedAt, uc.issuedAt].map((x) => x.toISOString()),
      );
      expect(uc.expiresAt.getTime() - uc.issuedAt.getTime()).toBe(7 * 86_400_000);
    }
    expect(await issuances()).toBe(before + 30);
  });

  it('a key committed for another coupon after the group read the keys: the group runs again and only that grab is refused', async () => {
    const [a, b] = await Promise.all([createCoupon(t.url, { totalStock: 10 }), createCoupon(t.url, { totalStock: 10 })]);
    const couponA = await coupons.template(a.id);
    const couponB = await coupons.template(b.id);
    // The same user and key, grabbed for coupon B in a transaction held open: the group's INSERT waits on that key.
    const other = t.db.createQueryRunner();
    await other.connect();
    await other.startTransaction('READ COMMITTED');
    try {
      await t.app.get(IssueService).issue(other.manager, {
        coupon: couponB,
        userId: 'both-coupons',
        source: 'GRAB',
        fromStock: true,
        idempotencyKey: 'same-key',
        txId: 'grab:same-key',
      });
      const requests = [
        ...[1, 2, 3].map((i) => ({ userId: `bystander-${i}`, key: newKey() })),
        { userId: 'both-coupons', key: 'same-key' },
        { userId: 'bystander-4', key: newKey() },
      ];
      const answers = Promise.all(requests.map((r) => groups.submit(couponA, r)));
      await waitForBlockedInsert();
      await other.commitTransaction();
      expect((await answers).map(granted)).toEqual(['GRANTED', 'GRANTED', 'GRANTED', 'IDEMPOTENCY_KEY_REUSED', 'GRANTED']);
    } finally {
      if (other.isTransactionActive) await other.rollbackTransaction();
      await other.release();
    }
    // The four bystanders were issued together, by the group's second run.
    expect(await groupSizes(a.id)).toEqual([4]);
  });

  it('a lone grab waits at most GRAB_GROUP_WAIT_MS (0: the end of the event-loop turn), and grabs arriving meanwhile join its group', async () => {
    const coupon = await coupons.template((await createCoupon(t.url, { totalStock: 10 })).id);
    const started = performance.now();
    const first = groups.submit(coupon, { userId: 'lone-0', key: newKey() });
    const firstDone = first.then(() => performance.now() - started);
    await new Promise((r) => setTimeout(r, 50));
    const later = await Promise.all([1, 2, 3].map((i) => groups.submit(coupon, { userId: `lone-${i}`, key: newKey() })));
    const elapsed = await firstDone;

    expect([await first, ...later].map(granted)).toEqual(['GRANTED', 'GRANTED', 'GRANTED', 'GRANTED']);
    if (waitMs === 0) {
      // It did not wait for the grabs 50 ms later: it ran in a group of its own.
      expect(await groupSizes(coupon.id)).toEqual([1, 3]);
    } else {
      expect(elapsed).toBeGreaterThanOrEqual(waitMs - 5);
      expect(elapsed).toBeLessThan(waitMs + 5000);
      expect(await groupSizes(coupon.id)).toEqual([4]);
    }
  });

  it("a group cut short by its earliest request's deadline refuses only the requests out of time: the others go into the next group", async () => {
    const coupon = await coupons.template((await createCoupon(t.url, { totalStock: 10 })).id);
    await withStockHeld(coupon, async (submitBy, release) => {
      const first = submitBy(1000, 'cut-first');
      await waitForStatement(t.db, '%FROM coupon_stock%FOR UPDATE%');
      // Both queue behind the first one's group and then form the next, which runs under the earlier
      // deadline of the two (the second's): it ends while the row is still held.
      const second = submitBy(1600, 'cut-second');
      const third = submitBy(4000, 'cut-third');
      await new Promise((r) => setTimeout(r, 2000));
      await release();
      expect([await first, await second, await third]).toEqual(['PROTOCOL_SEQUENCE_TIMEOUT', 'PROTOCOL_SEQUENCE_TIMEOUT', 'GRANTED']);
      const issued = (await t.db.query(`SELECT user_id FROM user_coupon WHERE coupon_id = ?`, [coupon.id])) as { user_id: string }[];
      expect(issued.map((r) => r.user_id)).toEqual(['cut-third']);
    });
  });

  it('after a group cut short, only grabs with a second or more left try again: a stall costs a few groups, not one per deadline', async () => {
    const coupon = await coupons.template((await createCoupon(t.url, { totalStock: 10 })).id);
    const groupsSoFar = async () =>
      (await registry.getSingleMetric('grab_group_size')?.get())?.values.find(
        (v) => (v as { metricName?: string }).metricName === 'grab_group_size_count',
      )?.value ?? 0;
    await withStockHeld(coupon, async (submitBy, release) => {
      const before = await groupsSoFar();
      const first = submitBy(1000, 'floor-first');
      await waitForStatement(t.db, '%FROM coupon_stock%FOR UPDATE%');
      // Eight deadlines a little apart, all ending while the row is held, and one that outlasts the hold.
      const short = Array.from({ length: 8 }, (_, i) => submitBy(1300 + 30 * i, `floor-short-${i}`));
      const long = submitBy(4000, 'floor-long');
      await new Promise((r) => setTimeout(r, 2000));
      await release();
      expect([await first, ...(await Promise.all(short)), await long]).toEqual([
        ...Array.from({ length: 9 }, () => 'PROTOCOL_SEQUENCE_TIMEOUT'),
        'GRANTED',
      ]);
      // The first alone, then the nine, then the one with time left: not one more group for each short deadline.
      expect((await groupsSoFar()) - before).toBe(3);
    });
  });

  it('a grab whose request deadline passes while it queues behind a blocked group is refused, not issued afterwards', async () => {
    const coupon = await coupons.template((await createCoupon(t.url, { totalStock: 10 })).id);
    const blocker = t.db.createQueryRunner();
    await blocker.connect();
    await blocker.startTransaction('READ COMMITTED');
    try {
      await blocker.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ? FOR UPDATE`, [coupon.id]);
      // Outside any request (no deadline), like the first grab of a queue whose request was answered long ago.
      const first = groups.submit(coupon, { userId: 'deadline-first', key: newKey() });
      await waitForStatement(t.db, '%FROM coupon_stock%FOR UPDATE%');
      let late!: Promise<GrabDecision>;
      withDeadline({ at: Date.now() + 600, answered: false }, () => {
        late = groups.submit(coupon, { userId: 'deadline-late', key: newKey() });
      });
      const lateOutcome = late.then(granted, (err: { code?: string }) => err.code);
      await new Promise((r) => setTimeout(r, 1000));
      await blocker.commitTransaction();
      expect(granted(await first)).toBe('GRANTED');
      expect(await lateOutcome).toBe('SERVICE_UNAVAILABLE');
      const [{ n }] = (await t.db.query(`SELECT COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? AND user_id = 'deadline-late'`, [
        coupon.id,
      ])) as { n: string }[];
      expect(Number(n)).toBe(0);
    } finally {
      if (blocker.isTransactionActive) await blocker.rollbackTransaction();
      await blocker.release();
    }
  });
});
