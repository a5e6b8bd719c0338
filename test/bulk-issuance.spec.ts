import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Agent, request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import request from 'supertest';
import { IssuanceRunner, MAX_PAUSES } from '../src/issuance/issuance-runner.js';
import { listSkips } from '../src/issuance/issuance.store.js';
import { healthOnAgent, sendOnAgent } from './support/early-answer.js';
import { createCoupon, newKey } from './support/factories.js';
import { adminToken, bearer, startTestApp, TestApp, tokenFor } from './support/harness.js';
import { waitForStatement } from './support/processlist.js';
import { checkInvariantsAfterEach } from './support/scoped-invariants.js';
import { startStallProxy, type StallProxy } from './support/stall-proxy.js';
import { startTcpProxy, type TcpProxy } from './support/tcp-proxy.js';

/**
 * A CSV upload of `t` left open after 2,500 lines, once its job row holds the first chunk: the
 * request (to write the rest with `end`), its answer to come, and the job's id.
 */
async function startCsvUpload(t: TestApp, couponId: string, key: string, prefix: string) {
  const url = new URL(`${t.url}/admin/coupons/${couponId}/issuances?reason=r&fromStock=false`);
  const req = httpRequest(url, {
    method: 'POST',
    headers: { ...bearer(adminToken()), 'Idempotency-Key': key, 'Content-Type': 'text/csv' },
  });
  const answer = new Promise<{ status: number; body: { code?: string }; headers: IncomingHttpHeaders }>((resolve, reject) => {
    req.on('response', (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as { code?: string }, headers: res.headers }));
    });
    req.on('error', reject);
  });
  req.write(Array.from({ length: 2500 }, (_, i) => `${prefix}-${i}\n`).join(''));
  let jobId: string | undefined;
  for (let i = 0; i < 200 && jobId === undefined; i++) {
    const [row] = (await t.db.query(`SELECT id FROM issuance_job WHERE idempotency_key = ? AND total > 0`, [key])) as { id: string }[];
    jobId = row?.id;
    if (jobId === undefined) await new Promise((r) => setTimeout(r, 20));
  }
  expect(jobId).toBeDefined();
  return { req, answer, jobId: jobId as string };
}

describe('bulk issuance', () => {
  let t: TestApp;
  const admin = () => bearer(adminToken());

  beforeAll(async () => {
    t = await startTestApp({ BULK_BATCH_SIZE: '7' });
  });
  checkInvariantsAfterEach(() => t.db);
  afterAll(async () => {
    await t.close();
  });

  const post = (couponId: string, body: unknown, key = newKey('bulk')) =>
    request(t.url)
      .post(`/admin/coupons/${couponId}/issuances`)
      .set(admin())
      .set('Idempotency-Key', key)
      .send(body as object);
  const postCsv = (couponId: string, csv: string | Buffer, query = 'reason=csv&fromStock=false', key = newKey('bulk')) =>
    request(t.url)
      .post(`/admin/coupons/${couponId}/issuances?${query}`)
      .set(admin())
      .set('Idempotency-Key', key)
      .set('Content-Type', 'text/csv')
      .send(typeof csv === 'string' ? csv : csv);
  const csvAs = (couponId: string, contentType: string, body: Buffer) =>
    request(t.url)
      .post(`/admin/coupons/${couponId}/issuances?reason=r&fromStock=false`)
      .set(admin())
      .set('Idempotency-Key', newKey('bulk'))
      .set('Content-Type', contentType)
      .send(body);
  const job = async (jobId: string) => (await request(t.url).get(`/admin/issuance-jobs/${jobId}`).set(admin())).body;
  const run = () => t.app.get(IssuanceRunner).runQueued();
  const skipped = async (jobId: string) => {
    const items: { line: number; userId: string; reason: string }[] = [];
    let cursor: string | null = null;
    do {
      const res: request.Response = await request(t.url)
        .get(`/admin/issuance-jobs/${jobId}/skipped?limit=3${cursor ? `&cursor=${cursor}` : ''}`)
        .set(admin());
      expect(res.status).toBe(200);
      items.push(...res.body.items);
      cursor = res.body.nextCursor;
    } while (cursor);
    return items;
  };
  const bulkCoupons = async (couponId: string) =>
    (await t.db.query(`SELECT user_id, from_stock, reason FROM user_coupon WHERE coupon_id = ? AND source = 'BULK' ORDER BY user_id`, [
      couponId,
    ])) as { user_id: string; from_stock: number; reason: string }[];
  const stockOf = async (couponId: string) =>
    Number(((await t.db.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ?`, [couponId])) as { stock: string }[])[0].stock);

  it('issues once per listed user and skips invalid ids, repeats, users at their limit and lines past the stock', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 6, perUserLimit: 1 });
    const grab = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor('u1')))
      .set('Idempotency-Key', newKey());
    expect(grab.status).toBe(201);
    const userIds = ['u1', 'u2', 'u2', 'not valid!', 'u3', 'u4', 'u5', 'u6', 'u7', 'u8', 'u3', ''];
    const created = await post(coupon.id, { userIds, reason: 'VIP', fromStock: true });
    expect(created.status).toBe(202);
    const jobId = created.body.jobId as string;
    expect(await job(jobId)).toMatchObject({ status: 'QUEUED', total: 12, issued: 0 });

    await run();

    // Stock 6, one grabbed: u2..u6 take the other five, u7 and u8 find it gone.
    const done = await job(jobId);
    expect(done).toMatchObject({
      id: jobId,
      couponId: coupon.id,
      status: 'COMPLETED',
      total: 12,
      issued: 5,
      skipped: 7,
      skippedByReason: { USER_LIMIT_REACHED: 1, SOLD_OUT: 2, INVALID_USER_ID: 2, DUPLICATE: 2 },
    });
    expect(done.startedAt).toEqual(expect.any(String));
    expect(done.finishedAt).toEqual(expect.any(String));
    expect((await bulkCoupons(coupon.id)).map((r) => r.user_id)).toEqual(['u2', 'u3', 'u4', 'u5', 'u6']);
    expect(await skipped(jobId)).toEqual([
      { line: 1, userId: 'u1', reason: 'USER_LIMIT_REACHED' },
      { line: 3, userId: 'u2', reason: 'DUPLICATE' },
      { line: 4, userId: 'not valid!', reason: 'INVALID_USER_ID' },
      { line: 9, userId: 'u7', reason: 'SOLD_OUT' },
      { line: 10, userId: 'u8', reason: 'SOLD_OUT' },
      { line: 11, userId: 'u3', reason: 'DUPLICATE' },
      { line: 12, userId: '', reason: 'INVALID_USER_ID' },
    ]);
    expect(await stockOf(coupon.id)).toBe(0);
    const logs = (await t.db.query(
      `SELECT l.from_status, l.to_status, l.tx_id, l.reason FROM user_coupon_state_log l JOIN user_coupon uc ON uc.id = l.user_coupon_id
       WHERE uc.coupon_id = ? AND uc.source = 'BULK'`,
      [coupon.id],
    )) as { from_status: string | null; to_status: string; tx_id: string; reason: string }[];
    expect(logs).toHaveLength(5);
    expect(new Set(logs.map((l) => `${l.from_status}->${l.to_status} ${l.tx_id} ${l.reason}`))).toEqual(
      new Set([`null->UNUSED bulk:${jobId} VIP`]),
    );
    // A user coupon from a job shows its source.
    const mine = await request(t.url)
      .get('/me/coupons')
      .set(bearer(tokenFor('u2')));
    expect(mine.body.items.map((c: { source: string }) => c.source)).toEqual(['BULK']);
  });

  /** Every page of a job's skipped lines of `reason`, `limit` at a time, with the cursors that led on. */
  const skippedOf = async (jobId: string, reason: string, limit: number) => {
    const pages: { lines: number[]; nextCursor: string | null }[] = [];
    let cursor: string | null = null;
    do {
      const res: request.Response = await request(t.url)
        .get(`/admin/issuance-jobs/${jobId}/skipped?reason=${reason}&limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`)
        .set(admin());
      expect(res.status).toBe(200);
      expect(res.body.items.every((i: { reason: string }) => i.reason === reason)).toBe(true);
      pages.push({ lines: res.body.items.map((i: { line: number }) => i.line), nextCursor: res.body.nextCursor });
      cursor = res.body.nextCursor;
    } while (cursor);
    return pages;
  };
  const skippedCsv = (jobId: string, query = '') =>
    request(t.url).get(`/admin/issuance-jobs/${jobId}/skipped.csv${query}`).set(admin()).buffer(true);

  it("lists a job's skipped lines of one reason, paged, and exports them as a CSV that goes back up as a new job for exactly those users", async () => {
    const coupon = await createCoupon(t.url, { totalStock: 3, perUserLimit: 1 });
    // Stock for three: s1-s3 take it, the valid ids after them are SOLD_OUT, among invalid lines and a repeat.
    const long = 'a'.repeat(70);
    const userIds = [
      's1',
      's2',
      's3',
      '=1+2',
      's4',
      's1',
      '-s5',
      '@s6',
      'two\nlines',
      's7',
      's8',
      's9',
      'a,"b"',
      '',
      long,
      'x\nalice\ny',
      'a;=1',
      'nul\u0000bell\u0007del\u007f',
      'lone\ud800half',
    ];
    const created = await post(coupon.id, { userIds, reason: 'sale', fromStock: true });
    expect(created.status).toBe(202);
    const jobId = created.body.jobId as string;
    await run();
    expect(await job(jobId)).toMatchObject({
      status: 'COMPLETED',
      issued: 3,
      skippedByReason: { SOLD_OUT: 5, INVALID_USER_ID: 10, DUPLICATE: 1 },
    });

    // Two a page: the cursor is the last SOLD_OUT line listed, and the next page starts past it, not at the next line skipped.
    expect(await skippedOf(jobId, 'SOLD_OUT', 2)).toEqual([
      { lines: [5, 7], nextCursor: '7' },
      { lines: [10, 11], nextCursor: '11' },
      { lines: [12], nextCursor: null },
    ]);
    expect(await skippedOf(jobId, 'DUPLICATE', 20)).toEqual([{ lines: [6], nextCursor: null }]);
    expect(await skippedOf(jobId, 'USER_LIMIT_REACHED', 20)).toEqual([{ lines: [], nextCursor: null }]);

    const soldOut = await skippedCsv(jobId, '?reason=SOLD_OUT');
    expect(soldOut.status).toBe(200);
    expect(soldOut.headers['content-type']).toBe('text/csv; charset=utf-8');
    expect(soldOut.headers['content-disposition']).toBe(`attachment; filename="job-${jobId}-skipped-SOLD_OUT.csv"`);
    expect(soldOut.text).toBe('user_id\r\ns4\r\n-s5\r\ns7\r\ns8\r\ns9\r\n');

    // All reasons: an invalid line's text starts with a quote, so that it is no formula and no user id (the first
    // 64 characters of a longer one would be); one line each (the upload reads a line as one entry); a user id
    // (-s5) is written as it is, or it would not upload again.
    const all = await skippedCsv(jobId);
    expect(all.status).toBe(200);
    expect(all.headers['content-disposition']).toBe(`attachment; filename="job-${jobId}-skipped.csv"`);
    expect(all.text).toBe(
      [
        'user_id',
        "'=1+2",
        's4',
        's1',
        '-s5',
        "'@s6",
        "'two lines",
        's7',
        's8',
        's9',
        `"'a,""b"""`,
        "'",
        `'${long.slice(0, 64)}`,
        "'x alice y",
        `"'a;=1"`,
        // Control characters a spreadsheet would choke on, as spaces.
        "'nul bell del ",
        // A lone surrogate, which the column cannot hold, as its escape rather than U+FFFD.
        "'lone\\ud800half",
        '',
      ].join('\r\n'),
    );

    // After the sale: stock for the ones who missed out, and their file uploaded as it came.
    expect((await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(admin()).send({ delta: 10 })).status).toBe(200);
    const again = await postCsv(coupon.id, Buffer.from(soldOut.text), 'reason=restock&fromStock=true');
    expect(again.status).toBe(202);
    await run();
    expect(await job(again.body.jobId as string)).toMatchObject({ status: 'COMPLETED', total: 5, issued: 5, skipped: 0 });
    const restocked = (await bulkCoupons(coupon.id)).filter((r) => r.reason === 'restock').map((r) => r.user_id);
    expect(restocked.sort()).toEqual(['-s5', 's4', 's7', 's8', 's9']);
    expect(await stockOf(coupon.id)).toBe(5);
    // The file of all reasons uploaded as it came: every invalid line is invalid again, nobody it mentions gets a coupon.
    const report = await postCsv(coupon.id, Buffer.from(all.text), 'reason=report&fromStock=false');
    expect(report.status).toBe(202);
    await run();
    expect(await job(report.body.jobId as string)).toMatchObject({ status: 'COMPLETED', skippedByReason: { INVALID_USER_ID: 10 } });
    expect((await bulkCoupons(coupon.id)).filter((r) => ['alice', long.slice(0, 64)].includes(r.user_id))).toEqual([]);
  });

  it('streams a CSV of thousands of skipped lines read a page at a time, each line once, from the index of its reason', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 1 });
    // 6,001 lines: the odd ones valid (the first issued, the rest SOLD_OUT), the even ones invalid.
    const lines = Array.from({ length: 6001 }, (_, i) => (i % 2 === 0 ? `many-${i + 1}` : `bad id ${i + 1}`));
    const created = await postCsv(coupon.id, lines.join('\n'), 'reason=many&fromStock=true');
    expect(created.status).toBe(202);
    const jobId = created.body.jobId as string;
    t.config.BULK_BATCH_SIZE = 500;
    try {
      await run();
    } finally {
      t.config.BULK_BATCH_SIZE = 7;
    }
    expect(await job(jobId)).toMatchObject({ status: 'COMPLETED', issued: 1, skippedByReason: { SOLD_OUT: 3000, INVALID_USER_ID: 3000 } });

    const soldOut = await skippedCsv(jobId, '?reason=SOLD_OUT');
    expect(soldOut.status).toBe(200);
    expect(soldOut.headers['content-length']).toBeUndefined();
    expect(soldOut.text).toBe(['user_id', ...lines.filter((_, i) => i > 0 && i % 2 === 0), ''].join('\r\n'));
    const all = await skippedCsv(jobId);
    expect(all.text).toBe(['user_id', ...lines.slice(1).map((l) => (l.startsWith('bad') ? `'${l}` : l)), ''].join('\r\n'));

    // The statement a page of one reason is read with: its plan reads that reason's lines only, in order.
    const sent: [string, unknown[]][] = [];
    const recorder = { query: async (sql: string, params: unknown[]) => (sent.push([sql, params]), []) };
    await listSkips(recorder as unknown as Parameters<typeof listSkips>[0], jobId, 'SOLD_OUT', 0, 2001);
    const [plan] = (await t.db.query(`EXPLAIN ${sent[0][0]}`, sent[0][1])) as { key: string; Extra: string | null }[];
    expect(plan.key).toBe('idx_issuance_skip_reason');
    expect(plan.Extra ?? '').not.toMatch(/filesort/);
  });

  it('refuses an unknown reason with 400 and an unknown job with 404, on the list and on its CSV', async () => {
    const coupon = await createCoupon(t.url);
    const created = await post(coupon.id, { userIds: ['r1'], reason: 'r', fromStock: false });
    const jobId = created.body.jobId as string;
    for (const path of [`/admin/issuance-jobs/${jobId}/skipped`, `/admin/issuance-jobs/${jobId}/skipped.csv`]) {
      for (const query of ['?reason=sold_out', '?reason=ISSUED', '?reason=', '?reason=SOLD_OUT&reason=DUPLICATE']) {
        const res = await request(t.url).get(`${path}${query}`).set(admin());
        expect([path, query, res.status, res.body.code]).toEqual([path, query, 400, 'VALIDATION_FAILED']);
      }
    }
    // The CSV is the whole list: no page of it.
    const paged = await skippedCsv(jobId, '?limit=10');
    expect([paged.status, paged.body.code]).toEqual([400, 'VALIDATION_FAILED']);
    for (const path of [
      '/admin/issuance-jobs/999999999/skipped?reason=SOLD_OUT',
      '/admin/issuance-jobs/999999999/skipped.csv?reason=SOLD_OUT',
    ]) {
      const res = await request(t.url).get(path).set(admin());
      expect([path, res.status, res.body.code]).toEqual([path, 404, 'ISSUANCE_JOB_NOT_FOUND']);
      expect(res.headers['content-disposition']).toBeUndefined();
    }
  });

  it('counts grabs and bulk issues together for perUserLimit, and a bulk coupon stops the user grabbing', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10, perUserLimit: 1 });
    const created = await post(coupon.id, { userIds: ['v1', 'v2'], reason: 'partners', fromStock: false });
    await run();
    expect(await job(created.body.jobId)).toMatchObject({ status: 'COMPLETED', issued: 2 });
    // Not from stock: the stock is untouched and the coupons are not counted against it.
    expect(await stockOf(coupon.id)).toBe(10);
    expect((await bulkCoupons(coupon.id)).map((r) => r.from_stock)).toEqual([0, 0]);
    const grab = await request(t.url)
      .post(`/coupons/${coupon.id}/grab`)
      .set(bearer(tokenFor('v1')))
      .set('Idempotency-Key', newKey());
    expect([grab.status, grab.body.code]).toEqual([409, 'USER_LIMIT_REACHED']);
  });

  it('holds perUserLimit while grabs of the same users race the job', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100, perUserLimit: 1 });
    const users = Array.from({ length: 40 }, (_, i) => `race-${i}`);
    const created = await post(coupon.id, { userIds: users, reason: 'race', fromStock: true });
    const [, grabs] = await Promise.all([
      run(),
      Promise.all(
        users.map((u) =>
          request(t.url)
            .post(`/coupons/${coupon.id}/grab`)
            .set(bearer(tokenFor(u)))
            .set('Idempotency-Key', newKey()),
        ),
      ),
    ]);
    const rows = (await t.db.query(`SELECT user_id, COUNT(*) AS n FROM user_coupon WHERE coupon_id = ? GROUP BY user_id`, [coupon.id])) as {
      user_id: string;
      n: string;
    }[];
    expect(rows).toHaveLength(40);
    expect(rows.every((r) => Number(r.n) === 1)).toBe(true);
    const grabbed = grabs.filter((g) => g.status === 201).length;
    const done = await job(created.body.jobId);
    expect(done.issued + grabbed).toBe(40);
    expect(done.skippedByReason.USER_LIMIT_REACHED).toBe(grabbed);
    expect(grabs.every((g) => g.status === 201 || g.body.code === 'USER_LIMIT_REACHED')).toBe(true);
    expect(await stockOf(coupon.id)).toBe(60);
  });

  it('a repeat of the Idempotency-Key answers the same job; the key for another coupon is 422', async () => {
    const coupon = await createCoupon(t.url);
    const other = await createCoupon(t.url);
    const key = newKey('same');
    const body = { userIds: ['w1'], reason: 'r', fromStock: false };
    const first = await post(coupon.id, body, key);
    const again = await post(coupon.id, body, key);
    expect([first.status, again.status]).toEqual([202, 202]);
    expect(again.body.jobId).toBe(first.body.jobId);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const elsewhere = await post(other.id, body, key);
    expect([elsewhere.status, elsewhere.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    // A user id may hold a line break in JSON (it is skipped as INVALID_USER_ID): that list is not the two ids it spells.
    for (const changed of [
      { reason: 'other' },
      { fromStock: true },
      { userIds: ['w1', 'w2'] },
      { userIds: ['w2'] },
      { userIds: ['w1\nw2'] },
    ]) {
      const reused = await post(coupon.id, { ...body, ...changed }, key);
      expect([changed, reused.status, reused.body.code, reused.body.details]).toEqual([
        changed,
        422,
        'IDEMPOTENCY_KEY_REUSED',
        { jobId: first.body.jobId },
      ]);
    }
    // The same list as a CSV is the same request.
    const csv = await request(t.url)
      .post(`/admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false`)
      .set(bearer(adminToken()))
      .set('Idempotency-Key', key)
      .set('Content-Type', 'text/csv')
      .send('w1\n');
    expect([csv.status, csv.body.jobId, csv.headers['idempotent-replayed']]).toEqual([202, first.body.jobId, 'true']);
    await run();
    expect(await bulkCoupons(coupon.id)).toHaveLength(1);
  });

  it('a list holding a lone surrogate is not the one holding U+FFFD in its place', async () => {
    const coupon = await createCoupon(t.url);
    const key = newKey('surrogate');
    expect((await post(coupon.id, { userIds: ['s1', '\ud800'], reason: 'r', fromStock: false }, key)).status).toBe(202);
    const other = await post(coupon.id, { userIds: ['s1', '\ufffd'], reason: 'r', fromStock: false }, key);
    expect([other.status, other.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
  });

  it('a list whose user id holds a line break is not the list of the ids it spells, as JSON or CSV', async () => {
    const coupon = await createCoupon(t.url);
    const key = newKey('split');
    const first = await post(coupon.id, { userIds: ['s1\ns2'], reason: 'r', fromStock: false }, key);
    expect(first.status).toBe(202);
    const asTwo = await post(coupon.id, { userIds: ['s1', 's2'], reason: 'r', fromStock: false }, key);
    const asCsv = await postCsv(coupon.id, 's1\ns2\n', 'reason=r&fromStock=false', key);
    expect([asTwo.status, asTwo.body.code, asCsv.status, asCsv.body.code]).toEqual([
      422,
      'IDEMPOTENCY_KEY_REUSED',
      422,
      'IDEMPOTENCY_KEY_REUSED',
    ]);
  });

  it('repeats of a key sent while the first list is still being stored wait for it and answer the same job', async () => {
    const coupon = await createCoupon(t.url);
    const key = newKey('parallel');
    const body = { userIds: Array.from({ length: 5000 }, (_, i) => `par-${i}`), reason: 'r', fromStock: false };
    const answers = await Promise.all(Array.from({ length: 6 }, () => post(coupon.id, body, key)));
    expect(answers.map((a) => a.status)).toEqual([202, 202, 202, 202, 202, 202]);
    expect(new Set(answers.map((a) => a.body.jobId)).size).toBe(1);
    expect(answers.filter((a) => a.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
    await run();
    expect(await bulkCoupons(coupon.id)).toHaveLength(5000);
  });

  it('reads a CSV upload with CRLF, blank lines, a header and a BOM, and counts line numbers of the file', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const created = await postCsv(coupon.id, '\uFEFFuser_id\r\nc1\r\n\r\nc2\n  c3  \n\nc1\nc4');
    expect(created.status).toBe(202);
    await run();
    expect(await job(created.body.jobId)).toMatchObject({ status: 'COMPLETED', total: 5, issued: 4, skippedByReason: { DUPLICATE: 1 } });
    expect(await skipped(created.body.jobId)).toEqual([{ line: 7, userId: 'c1', reason: 'DUPLICATE' }]);
    expect((await bulkCoupons(coupon.id)).map((r) => r.user_id)).toEqual(['c1', 'c2', 'c3', 'c4']);
  });

  it('takes a first line uid or id as the user it names; header=present or absent (RFC 4180) says which the first line is', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 10 });
    const plain = await postCsv(coupon.id, 'uid\nh1\n');
    const present = await csvAs(coupon.id, 'text/csv; header=present', Buffer.from('h2\nh3\n'));
    const absent = await csvAs(coupon.id, 'text/csv; header=absent', Buffer.from('user_id\nh4\n'));
    expect([plain.status, present.status, absent.status]).toEqual([202, 202, 202]);
    await run();
    expect(await job(plain.body.jobId)).toMatchObject({ status: 'COMPLETED', total: 2, issued: 2 });
    expect(await job(present.body.jobId)).toMatchObject({ status: 'COMPLETED', total: 1, issued: 1 });
    expect(await job(absent.body.jobId)).toMatchObject({ status: 'COMPLETED', total: 2, issued: 2 });
    expect((await bulkCoupons(coupon.id)).map((r) => r.user_id)).toEqual(['h1', 'h3', 'h4', 'uid', 'user_id']);
    // Another value is refused before anything is stored: the key stays free.
    const key = newKey('bulk');
    const send = (type: string) =>
      request(t.url)
        .post(`/admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false`)
        .set(admin())
        .set('Idempotency-Key', key)
        .set('Content-Type', type)
        .send('h5\n');
    const bad = await send('text/csv; header=yes');
    expect([bad.status, bad.body.code, bad.body.details]).toEqual([
      400,
      'VALIDATION_FAILED',
      { fields: { 'Content-Type': ['its header parameter must be present or absent (RFC 4180)'] } },
    ]);
    expect((await send('text/csv')).status).toBe(202);
  });

  it('issues a 20,000-line CSV in batches, exactly once per user, resuming after being stopped midway', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 30000 });
    const csv = Array.from({ length: 20000 }, (_, i) => `big-${i}`).join('\n');
    const created = await postCsv(coupon.id, csv, 'reason=big&fromStock=true');
    expect(created.status).toBe(202);
    const jobId = created.body.jobId as string;
    const runner = t.app.get(IssuanceRunner);
    // The small batches of the other tests would make this one 3,000 transactions.
    t.config.BULK_BATCH_SIZE = 500;
    const stop = new AbortController();
    const watching = setInterval(async () => {
      if ((await job(jobId)).issued > 0) stop.abort();
    }, 20);
    await runner.runQueued(stop.signal);
    clearInterval(watching);
    const midway = await job(jobId);
    expect(midway.status).toBe('RUNNING');
    expect(midway.issued).toBeGreaterThan(0);
    expect(midway.issued).toBeLessThan(20000);
    await runner.runQueued();
    expect(await job(jobId)).toMatchObject({ status: 'COMPLETED', total: 20000, issued: 20000, skipped: 0 });
    const [{ n, users }] = (await t.db.query(
      `SELECT COUNT(*) AS n, COUNT(DISTINCT user_id) AS users FROM user_coupon WHERE coupon_id = ? AND source = 'BULK'`,
      [coupon.id],
    )) as { n: string; users: string }[];
    expect([Number(n), Number(users)]).toEqual([20000, 20000]);
    expect(await stockOf(coupon.id)).toBe(10000);
    t.config.BULK_BATCH_SIZE = 7;
  }, 120_000);

  /** Connections already killed: one can stay in the process list, its statement shown, for a moment after (CI killed one twice). */
  const killed = new Set<string>();
  /** Runs a pass whose first batch waits on the coupon's stock row (held by `holder`) and has its connection killed there. */
  async function passKilledMidBatch(): Promise<void> {
    const pass = run();
    for (let i = 0; i < 200; i++) {
      const rows = (await t.db.query(
        `SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND command <> 'Killed' AND info LIKE 'SELECT init_stock, stock FROM coupon_stock%FOR UPDATE'`,
      )) as { id: string }[];
      const victim = rows.map((r) => String(r.id)).find((id) => !killed.has(id));
      if (victim) {
        killed.add(victim);
        await t.db.query(`KILL ${Number(victim)}`);
        return pass;
      }
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error('no batch waited on the stock row');
  }
  /** Holds the coupon's stock row, so a batch waits on it where it can be found. */
  async function holdStockRow(couponId: string) {
    const holder = t.db.createQueryRunner();
    await holder.connect();
    await holder.startTransaction();
    await holder.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ? FOR UPDATE`, [couponId]);
    return {
      release: async () => {
        await holder.rollbackTransaction();
        await holder.release();
      },
    };
  }

  it('a batch whose connection is killed pauses the job (still RUNNING, nothing lost); the next pass issues every user exactly once', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100 });
    const users = Array.from({ length: 20 }, (_, i) => `killed-${i}`);
    const created = await post(coupon.id, { userIds: users, reason: 'r', fromStock: true });
    expect(created.status).toBe(202);
    const held = await holdStockRow(coupon.id);
    await passKilledMidBatch();
    await held.release();
    expect(await job(created.body.jobId)).toMatchObject({ status: 'RUNNING', issued: 0 });
    await run();
    expect(await job(created.body.jobId)).toMatchObject({ status: 'COMPLETED', issued: 20, skipped: 0 });
    expect((await bulkCoupons(coupon.id)).map((r) => r.user_id)).toEqual([...users].sort());
    expect(await stockOf(coupon.id)).toBe(80);
  });

  it(`a job whose batch meets a database error ${MAX_PAUSES} times in a row fails rather than holding the queue for ever`, async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100 });
    const created = await post(coupon.id, { userIds: ['again-1'], reason: 'r', fromStock: true });
    const held = await holdStockRow(coupon.id);
    for (let i = 1; i < MAX_PAUSES; i++) await passKilledMidBatch();
    expect(await job(created.body.jobId)).toMatchObject({ status: 'RUNNING', issued: 0 });
    await passKilledMidBatch();
    await held.release();
    expect(await job(created.body.jobId)).toMatchObject({ status: 'FAILED', issued: 0 });
  });

  it('decodes a CSV in the charset its Content-Type names (a GBK spreadsheet export), UTF-8 otherwise', async () => {
    const coupon = await createCoupon(t.url);
    // "用户" (user) in GBK, then two ids: the Chinese line is not a user id, and is not UTF-8.
    const gbk = Buffer.concat([Buffer.from([0xd3, 0xc3, 0xbb, 0xa7]), Buffer.from('\r\ngbk-1\r\ngbk-2\r\n')]);
    expect((await csvAs(coupon.id, 'text/csv', gbk)).status).toBe(400);
    const created = await csvAs(coupon.id, 'text/csv; charset=GBK', gbk);
    expect(created.status).toBe(202);
    await run();
    expect(await job(created.body.jobId)).toMatchObject({ status: 'COMPLETED', issued: 2, skipped: 1 });
    expect(await skipped(created.body.jobId)).toEqual([{ line: 1, userId: '用户', reason: 'INVALID_USER_ID' }]);
  });

  it('cancels a queued job before it issues anything; a finished job cannot be cancelled', async () => {
    const coupon = await createCoupon(t.url);
    const queued = await post(coupon.id, { userIds: ['x1', 'x2'], reason: 'r', fromStock: false });
    const cancelled = await request(t.url).post(`/admin/issuance-jobs/${queued.body.jobId}/cancel`).set(admin());
    expect([cancelled.status, cancelled.body.status]).toEqual([200, 'CANCELLED']);
    expect(cancelled.body.finishedAt).toEqual(expect.any(String));
    const twice = await request(t.url).post(`/admin/issuance-jobs/${queued.body.jobId}/cancel`).set(admin());
    expect([twice.status, twice.body.status]).toEqual([200, 'CANCELLED']);
    await run();
    expect(await bulkCoupons(coupon.id)).toHaveLength(0);

    const finished = await post(coupon.id, { userIds: ['x3'], reason: 'r', fromStock: false });
    await run();
    const late = await request(t.url).post(`/admin/issuance-jobs/${finished.body.jobId}/cancel`).set(admin());
    expect([late.status, late.body.code]).toEqual([409, 'ISSUANCE_JOB_FINISHED']);
  });

  it('a job cancelled midway: its unprocessed lines, without repeats, as a CSV that goes back up as a new job and finishes it', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 100 });
    // Batches of 7; repeats among the first lines, and later ones of lines before and after the cut.
    const userIds = [
      'c1',
      'c2',
      'c3',
      'c1',
      'c4',
      'c5',
      'c6',
      'c7',
      'c8',
      'c2',
      'c9',
      'c10',
      'c8',
      'c11',
      'c12',
      'c9',
      'c13',
      'c14',
      'c15',
      'c16',
    ];
    const created = await post(coupon.id, { userIds, reason: 'r', fromStock: true });
    const jobId = created.body.jobId as string;
    // The first batch waits on the stock row, the cancel on the job row behind it: the job stops after that batch.
    const holder = await holdStockRow(coupon.id);
    const pass = run();
    await waitForStatement(t.db, 'SELECT init_stock, stock FROM coupon_stock%FOR UPDATE');
    const cancel = request(t.url).post(`/admin/issuance-jobs/${jobId}/cancel`).set(admin());
    const cancelled = cancel.then((r) => r);
    await waitForStatement(t.db, 'SELECT * FROM issuance_job WHERE id = %FOR UPDATE');
    await holder.release();
    expect((await cancelled).body.status).toBe('CANCELLED');
    await pass;
    const stopped = await job(jobId);
    const done = stopped.issued + stopped.skipped;
    expect([stopped.status, done > 0 && done < userIds.length]).toEqual(['CANCELLED', true]);

    const file = await request(t.url).get(`/admin/issuance-jobs/${jobId}/unprocessed.csv`).set(admin()).buffer(true);
    expect([file.status, file.headers['content-type'], file.headers['content-disposition']]).toEqual([
      200,
      'text/csv; charset=utf-8',
      `attachment; filename="job-${jobId}-unprocessed.csv"`,
    ]);
    const rest = userIds.slice(done).filter((u, i) => !userIds.slice(0, done + i).includes(u));
    expect(file.text).toBe(`user_id\r\n${rest.map((u) => `${u}\r\n`).join('')}`);

    const again = await postCsv(coupon.id, file.text, 'reason=r&fromStock=true');
    expect(again.status).toBe(202);
    await run();
    expect(await job(again.body.jobId)).toMatchObject({ status: 'COMPLETED', issued: rest.length, skipped: 0 });
    expect((await bulkCoupons(coupon.id)).map((c) => c.user_id)).toEqual([...new Set(userIds)].sort());

    const completed = await request(t.url).get(`/admin/issuance-jobs/${again.body.jobId}/unprocessed.csv`).set(admin());
    expect([completed.status, completed.text]).toEqual([200, 'user_id\r\n']);
    const unknown = await request(t.url).get('/admin/issuance-jobs/999999999/unprocessed.csv').set(admin());
    expect([unknown.status, unknown.body.code]).toEqual([404, 'ISSUANCE_JOB_NOT_FOUND']);
    const query = await request(t.url).get(`/admin/issuance-jobs/${jobId}/unprocessed.csv?reason=SOLD_OUT`).set(admin());
    expect([query.status, query.body.code]).toEqual([400, 'VALIDATION_FAILED']);
  });

  it('a repeat finds the upload of an instance that died mid-upload (still past STALE_UPLOAD_MS) and takes the key; a live one is waited for', async () => {
    const coupon = await createCoupon(t.url);
    const uploading = (key: string, secondsAgo: number) =>
      t.db.query(
        `INSERT INTO issuance_job (coupon_id, idempotency_key, reason, from_stock, status, created_by, created_at, updated_at)
         VALUES (?, ?, 'r', 0, 'UPLOADING', 'admin-1', NOW(3) - INTERVAL ? SECOND, NOW(3) - INTERVAL ? SECOND) RETURNING id`,
        [coupon.id, key, secondsAgo, secondsAgo],
      ) as Promise<{ id: string }[]>;
    const deadKey = newKey('dead');
    const [dead] = await uploading(deadKey, 31);
    const retried = await post(coupon.id, { userIds: ['d1'], reason: 'r', fromStock: false }, deadKey);
    expect([retried.status, retried.headers['idempotent-replayed']]).toEqual([202, undefined]);
    expect(retried.body.jobId).not.toBe(String(dead.id));
    expect(await t.db.query(`SELECT status FROM issuance_job WHERE id = ?`, [dead.id])).toEqual([{ status: 'DISCARDED' }]);
    const liveKey = newKey('live');
    const [live] = await uploading(liveKey, 1);
    const waited = await post(coupon.id, { userIds: ['d2'], reason: 'r', fromStock: false }, liveKey);
    expect([waited.status, waited.body.code, waited.body.details]).toEqual([409, 'IDEMPOTENCY_IN_PROGRESS', { jobId: String(live.id) }]);
    await t.db.query(`DELETE FROM issuance_job WHERE id = ?`, [live.id]);
  });

  it('an upload discarded while it was still arriving (taken for dead) writes nothing more and answers 503, not 202 for a dead job', async () => {
    const coupon = await createCoupon(t.url);
    const key = newKey('stalled');
    const { req, answer, jobId } = await startCsvUpload(t, coupon.id, key, 's');
    // What a repeat of the key, or the runner, does to an upload still for STALE_UPLOAD_MS.
    await t.db.query(`UPDATE issuance_job SET status = 'DISCARDED', idempotency_key = CONCAT('discarded:', id) WHERE id = ?`, [jobId]);
    const [{ n: before }] = (await t.db.query(`SELECT COUNT(*) AS n FROM issuance_job_line WHERE job_id = ?`, [jobId])) as { n: string }[];
    req.end(Array.from({ length: 2500 }, (_, i) => `s-${2500 + i}\n`).join(''));
    const res = await answer;
    expect([res.status, res.body.code]).toEqual([503, 'SERVICE_UNAVAILABLE']);
    expect((await t.db.query(`SELECT COUNT(*) AS n FROM issuance_job_line WHERE job_id = ?`, [jobId])) as { n: string }[]).toEqual([
      { n: before },
    ]);
  });

  it('lists jobs newest first, of one coupon or all, a page at a time, without uploads still arriving', async () => {
    const coupon = await createCoupon(t.url);
    const ids: string[] = [];
    for (const userIds of [['l1'], ['l2', 'l3'], ['l4']])
      ids.push((await post(coupon.id, { userIds, reason: 'list', fromStock: false })).body.jobId);
    await run();
    // An upload in progress has answered no one yet: not listed.
    const [uploading] = (await t.db.query(
      `INSERT INTO issuance_job (coupon_id, idempotency_key, reason, from_stock, status, created_by, created_at, updated_at)
       VALUES (?, ?, 'r', 0, 'UPLOADING', 'admin-1', NOW(3), NOW(3)) RETURNING id`,
      [coupon.id, newKey('uploading')],
    )) as { id: string }[];
    const list = (query: string) => request(t.url).get(`/admin/issuance-jobs?${query}`).set(admin());
    const first = await list(`couponId=${coupon.id}&limit=2`);
    expect(first.status).toBe(200);
    expect(first.body.items.map((j: { id: string }) => j.id)).toEqual([ids[2], ids[1]]);
    expect(first.body.items[1]).toMatchObject({ couponId: coupon.id, status: 'COMPLETED', total: 2, issued: 2, reason: 'list' });
    const second = await list(`couponId=${coupon.id}&limit=2&cursor=${first.body.nextCursor}`);
    expect(second.body).toEqual({ items: [expect.objectContaining({ id: ids[0] })], nextCursor: null });
    const all = await list('limit=100');
    const listed = all.body.items.map((j: { id: string }) => j.id);
    expect(listed.slice(0, 3)).toEqual([ids[2], ids[1], ids[0]]);
    expect(listed).not.toContain(String(uploading.id));
    expect((await list('limit=0')).status).toBe(400);
    expect((await list('couponId=abc')).status).toBe(400);
    await t.db.query(`DELETE FROM issuance_job WHERE id = ?`, [uploading.id]);
  });

  it('refuses bad input with a 4xx and stores nothing', async () => {
    const coupon = await createCoupon(t.url);
    const before = Number(
      ((await t.db.query(`SELECT COUNT(*) AS n FROM issuance_job WHERE status <> 'DISCARDED'`)) as { n: string }[])[0].n,
    );
    const ok = { userIds: ['y1'], reason: 'r', fromStock: false };
    const cases: [string, () => request.Test, number, string][] = [
      ['no key', () => request(t.url).post(`/admin/coupons/${coupon.id}/issuances`).set(admin()).send(ok), 400, 'VALIDATION_FAILED'],
      ['bad key', () => post(coupon.id, ok, 'has space'), 400, 'VALIDATION_FAILED'],
      ['empty list', () => post(coupon.id, { ...ok, userIds: [] }), 400, 'VALIDATION_FAILED'],
      ['empty file', () => postCsv(coupon.id, ''), 400, 'VALIDATION_FAILED'],
      ['a file of a header and blank lines', () => postCsv(coupon.id, 'user_id\r\n\r\n  \n'), 400, 'VALIDATION_FAILED'],
      [
        'over 10,000 ids',
        () => post(coupon.id, { ...ok, userIds: Array.from({ length: 10001 }, (_, i) => `z${i}`) }),
        400,
        'VALIDATION_FAILED',
      ],
      ['a number in the list', () => post(coupon.id, { ...ok, userIds: [1] }), 400, 'VALIDATION_FAILED'],
      ['no reason', () => post(coupon.id, { userIds: ['y1'], fromStock: false }), 400, 'VALIDATION_FAILED'],
      ['a blank reason', () => post(coupon.id, { ...ok, reason: ' \t ' }), 400, 'VALIDATION_FAILED'],
      ['a reason with a NUL', () => post(coupon.id, { ...ok, reason: 'a\u0000b' }), 400, 'VALIDATION_FAILED'],
      ['CSV with a reason holding a NUL', () => postCsv(coupon.id, 'y1\n', 'reason=a%00b&fromStock=false'), 400, 'VALIDATION_FAILED'],
      ['unknown field', () => post(coupon.id, { ...ok, extra: 1 }), 400, 'VALIDATION_FAILED'],
      [
        'query with JSON',
        () => request(t.url).post(`/admin/coupons/${coupon.id}/issuances?reason=x`).set(admin()).set('Idempotency-Key', newKey()).send(ok),
        400,
        'VALIDATION_FAILED',
      ],
      ['CSV without reason', () => postCsv(coupon.id, 'y1\n', 'fromStock=false'), 400, 'VALIDATION_FAILED'],
      ['CSV with a bad fromStock', () => postCsv(coupon.id, 'y1\n', 'reason=r&fromStock=yes'), 400, 'VALIDATION_FAILED'],
      [
        'CSV not UTF-8',
        () => postCsv(coupon.id, Buffer.concat([Buffer.from('y1\ny2\n'), Buffer.from([0xff, 0xfe, 0x41]), Buffer.from('\ny3\n')])),
        400,
        'VALIDATION_FAILED',
      ],
      [
        'CSV in a charset no decoder knows',
        () => csvAs(coupon.id, 'text/csv; charset=x-klingon', Buffer.from('y1\n')),
        415,
        'UNSUPPORTED_MEDIA_TYPE',
      ],
      ['unknown coupon', () => post('999999999', ok), 404, 'COUPON_NOT_FOUND'],
      [
        'not an admin',
        () =>
          request(t.url)
            .post(`/admin/coupons/${coupon.id}/issuances`)
            .set(bearer(tokenFor('y1')))
            .set('Idempotency-Key', newKey())
            .send(ok),
        403,
        'FORBIDDEN',
      ],
      [
        'CSV to another route',
        () => request(t.url).post('/admin/coupons').set(admin()).set('Content-Type', 'text/csv').send('a\n'),
        415,
        'UNSUPPORTED_MEDIA_TYPE',
      ],
      ['unknown job', () => request(t.url).get('/admin/issuance-jobs/999999999').set(admin()), 404, 'ISSUANCE_JOB_NOT_FOUND'],
      [
        "an unknown job's skipped lines",
        () => request(t.url).get('/admin/issuance-jobs/999999999/skipped').set(admin()),
        404,
        'ISSUANCE_JOB_NOT_FOUND',
      ],
      ['bad job id', () => request(t.url).get('/admin/issuance-jobs/abc').set(admin()), 400, 'VALIDATION_FAILED'],
    ];
    for (const [name, send, status, code] of cases) {
      const res = await send();
      expect(`${name}: ${res.status} ${res.body.code}`).toBe(`${name}: ${status} ${code}`);
    }
    const after = Number(
      ((await t.db.query(`SELECT COUNT(*) AS n FROM issuance_job WHERE status <> 'DISCARDED'`)) as { n: string }[])[0].n,
    );
    expect(after).toBe(before);
    expect(
      Number(
        (
          (await t.db.query(
            `SELECT COUNT(*) AS n FROM issuance_job_line l LEFT JOIN issuance_job j ON j.id = l.job_id WHERE j.id IS NULL`,
          )) as { n: string }[]
        )[0].n,
      ),
    ).toBe(0);
  });

  it('refuses a CSV over 64 MiB with 413 and keeps nothing of it: by its length before it is read, else (chunked) as it arrives', async () => {
    const coupon = await createCoupon(t.url);
    const line = Buffer.from('abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghij-abcdefghi\n');
    const body = Buffer.concat([Buffer.alloc(64 * 1024 * 1024 + 1 - line.length, 'a'.charCodeAt(0)).fill(line), line]);
    expect(body.length).toBe(64 * 1024 * 1024 + 1);
    const jobs = async () =>
      (await t.db.query(`SELECT status, idempotency_key FROM issuance_job WHERE coupon_id = ?`, [coupon.id])) as {
        status: string;
        idempotency_key: string;
      }[];
    const declared = await postCsv(coupon.id, body);
    expect([declared.status, declared.body.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
    expect(await jobs()).toEqual([]);
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const chunked = await send(agent, coupon.id, 'text/csv', body, true, '?reason=csv&fromStock=false');
      expect([chunked.status, (JSON.parse(chunked.body) as { code: string }).code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
    } finally {
      agent.destroy();
    }
    // Out of sight and its key free at once; its lines go with the runner's next pass.
    const [discarded] = await jobs();
    expect(discarded.status).toBe('DISCARDED');
    expect(discarded.idempotency_key).toMatch(/^discarded:/);
    await run();
    expect(await jobs()).toEqual([]);
    const orphans = (await t.db.query(
      `SELECT COUNT(*) AS n FROM issuance_job_line l LEFT JOIN issuance_job j ON j.id = l.job_id WHERE j.id IS NULL`,
    )) as { n: string }[];
    expect(Number(orphans[0].n)).toBe(0);
  }, 120_000);

  const send = (agent: Agent, couponId: string, contentType: string, body: string | Buffer, chunked: boolean, query = '') =>
    sendOnAgent(
      agent,
      'POST',
      `${t.url}/admin/coupons/${couponId}/issuances${query}`,
      { ...admin(), 'Idempotency-Key': newKey('bulk'), 'Content-Type': contentType },
      body,
      chunked,
    );
  const health = (agent: Agent) => healthOnAgent(agent, t.url);

  it('takes a JSON list of 10,000 ids of 64 characters, and refuses a JSON body over 1 MiB with 413, with or without a length', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 0 });
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const ids = Array.from({ length: 10_000 }, (_, i) => `u${String(i).padStart(63, '0')}`);
      const fits = JSON.stringify({ userIds: ids, reason: 'x'.repeat(200), fromStock: false }, null, 2);
      expect(Buffer.byteLength(fits)).toBeGreaterThan(64 * 1024);
      const accepted = await send(agent, coupon.id, 'application/json', fits, false);
      expect(accepted.status).toBe(202);
      // Its 10,000 lines are not for the runner of the tests after this one.
      const jobId = (JSON.parse(accepted.body) as { jobId: string }).jobId;
      expect((await request(t.url).post(`/admin/issuance-jobs/${jobId}/cancel`).set(admin())).status).toBe(200);

      const over = JSON.stringify({ userIds: ['u-1'], reason: 'r', fromStock: false, pad: 'x'.repeat(4 * 1024 * 1024) });
      // The client, still sending, gets the answer and keeps its connection: the rest is read and dropped.
      for (const chunked of [false, true]) {
        const refused = await send(agent, coupon.id, 'application/json; charset=utf-8', over, chunked);
        expect([refused.status, (JSON.parse(refused.body) as { code: string }).code, refused.connection, refused.sentAll]).toEqual([
          413,
          'PAYLOAD_TOO_LARGE',
          'keep-alive',
          true,
        ]);
        const next = await health(agent);
        expect([next.status, next.socket === refused.socket]).toEqual([200, true]);
      }
      const jobs = (await t.db.query(`SELECT COUNT(*) AS n FROM issuance_job WHERE coupon_id = ?`, [coupon.id])) as { n: string }[];
      expect(Number(jobs[0].n)).toBe(1);

      // A body of another type is 415 as on any route, not 413 for a JSON list.
      const plain = await request(t.url)
        .post(`/admin/coupons/${coupon.id}/issuances`)
        .set(admin())
        .set('Idempotency-Key', newKey('bulk'))
        .set('Content-Type', 'text/plain')
        .send('x'.repeat(2 * 1024 * 1024));
      expect([plain.status, plain.body.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);
    } finally {
      agent.destroy();
    }
  });

  it('a body refused before its end (415, or 400 for bytes that are not text) is read and dropped: the client gets the answer, the connection the next request', async () => {
    const coupon = await createCoupon(t.url);
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    // 4 MiB of lines, the second of them not UTF-8.
    const csv = Buffer.concat([Buffer.from('u-1\n'), Buffer.from([0xff, 0xfe, 0x0a]), Buffer.from('u-2\n'.repeat(1024 * 1024))]);
    try {
      for (const [type, body, code] of [
        ['text/plain', 'x'.repeat(4 * 1024 * 1024), 'UNSUPPORTED_MEDIA_TYPE'],
        ['text/csv', csv, 'VALIDATION_FAILED'],
      ] as const)
        for (const chunked of [false, true]) {
          const refused = await send(agent, coupon.id, type, body, chunked, '?reason=r&fromStock=false');
          const answer = JSON.parse(refused.body) as { code: string; details?: { fields?: object } };
          expect([type, chunked, answer.code, refused.connection, refused.sentAll]).toEqual([type, chunked, code, 'keep-alive', true]);
          if (type === 'text/csv') expect(Object.keys(answer.details?.fields ?? {})).toEqual(['body']);
          const next = await health(agent);
          expect([next.status, next.socket === refused.socket]).toEqual([200, true]);
        }
    } finally {
      agent.destroy();
    }
  }, 30_000);
});

describe('bulk issuance through a database outage', () => {
  const real = { host: process.env.DB_HOST ?? '127.0.0.1', port: Number(process.env.DB_PORT ?? 3306) };
  let proxy: TcpProxy;
  let t: TestApp;
  beforeAll(async () => {
    proxy = await startTcpProxy(real);
    t = await startTestApp({ DB_HOST: '127.0.0.1', DB_PORT: String(proxy.port), DB_POOL_SIZE: '4' });
  });
  afterAll(async () => {
    await t.close();
    await proxy.close();
  });

  it('an upload broken by the outage frees its key as soon as the database is back, not 30 s later', async () => {
    const coupon = await createCoupon(t.url);
    const key = newKey('outage');
    const { req, answer, jobId } = await startCsvUpload(t, coupon.id, key, 'o');
    // The database goes away with the rest of the list still to store: the upload breaks, and so does its discard.
    await proxy.close();
    req.end(Array.from({ length: 2500 }, (_, i) => `o-${2500 + i}\n`).join(''));
    expect((await answer).status).toBe(503);
    proxy = await startTcpProxy(real, { port: proxy.port });

    const retry = () =>
      request(t.url)
        .post(`/admin/coupons/${coupon.id}/issuances`)
        .set(bearer(adminToken()))
        .set('Idempotency-Key', key)
        .send({ userIds: ['o-retry'], reason: 'r', fromStock: false });
    // As a client would: again on 503 (the pool finds its connections cut) and on 409 (the key still taken).
    let retried = await retry();
    for (const stop = Date.now() + 10_000; [409, 503].includes(retried.status) && Date.now() < stop; retried = await retry())
      await new Promise((r) => setTimeout(r, 500));
    expect([retried.status, retried.body.code]).toEqual([202, undefined]);
    expect(retried.body.jobId).not.toBe(jobId);
    expect(await t.db.query(`SELECT status FROM issuance_job WHERE id = ?`, [jobId])).toEqual([{ status: 'DISCARDED' }]);
  }, 60_000);
});

describe("a bulk job's skipped lines as CSV, streamed past REQUEST_TIMEOUT_MS", () => {
  const real = { host: process.env.DB_HOST ?? '127.0.0.1', port: Number(process.env.DB_PORT ?? 3306) };
  let proxy: StallProxy;
  let t: TestApp;
  beforeAll(async () => {
    proxy = await startStallProxy(real);
    t = await startTestApp({
      DB_HOST: '127.0.0.1',
      DB_PORT: String(proxy.port),
      REQUEST_TIMEOUT_MS: '1000',
      BULK_UPLOAD_TIMEOUT_MS: '20000',
    });
  });
  afterAll(async () => {
    proxy.resume();
    await t.close();
    await proxy.close();
  });

  it('goes on to its last line when the database stalls mid-file for longer than the deadline of other requests', async () => {
    const coupon = await createCoupon(t.url);
    // Every line invalid, so skipped as it is stored: 50 pages of the file, no run needed.
    const lines = Array.from({ length: 100_000 }, (_, i) => `bad line ${i}`);
    const created = await request(t.url)
      .post(`/admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false`)
      .set(bearer(adminToken()))
      .set('Idempotency-Key', newKey('stream'))
      .set('Content-Type', 'text/csv')
      .send(lines.join('\n'));
    expect(created.status).toBe(202);

    const started = Date.now();
    const answer = await new Promise<{ status: number; complete: boolean; text: string }>((resolve, reject) => {
      const req = httpRequest(new URL(`${t.url}/admin/issuance-jobs/${created.body.jobId}/skipped.csv`), { headers: bearer(adminToken()) });
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        // The first bytes are out: the pages still to read wait 1.3 s for the database (the connection idles out after 2 s).
        res.once('data', () => {
          proxy.stall();
          setTimeout(() => proxy.resume(), 1300);
        });
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, complete: res.complete, text: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end();
    });
    expect(Date.now() - started).toBeGreaterThan(1300);
    expect([answer.status, answer.complete]).toEqual([200, true]);
    expect(answer.text).toBe(['user_id', ...lines.map((l) => `'${l}`), ''].join('\r\n'));
  }, 60_000);

  it('answers 503 within REQUEST_TIMEOUT_MS when the database does not answer before the file starts, as other routes do', async () => {
    const coupon = await createCoupon(t.url);
    const created = await request(t.url)
      .post(`/admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false`)
      .set(bearer(adminToken()))
      .set('Idempotency-Key', newKey('stall'))
      .set('Content-Type', 'text/csv')
      .send('bad line');
    expect(created.status).toBe(202);
    proxy.stall();
    try {
      const started = Date.now();
      const res = await request(t.url).get(`/admin/issuance-jobs/${created.body.jobId}/skipped.csv`).set(bearer(adminToken()));
      expect([res.status, res.body.code]).toEqual([503, 'SERVICE_UNAVAILABLE']);
      // REQUEST_TIMEOUT_MS (1 s) and the slack deadlines.spec gives a loaded machine.
      expect(Date.now() - started).toBeLessThan(2500);
    } finally {
      proxy.resume();
    }
  });
});

describe('a CSV upload in flight when its instance stops', () => {
  it('is answered 503 with Retry-After at once, not held to its deadline, and its key is free for the retry on another instance', async () => {
    const stopping = await startTestApp();
    const other = await startTestApp({}, stopping.config);
    let closed: Promise<void> | undefined;
    try {
      const coupon = await createCoupon(stopping.url, { totalStock: 10 });
      const key = newKey();
      const upload = await startCsvUpload(stopping, coupon.id, key, 'stopping');
      // What SIGTERM runs (shutdown.ts). Before, it waited for the upload, which a client still sending holds for its deadline.
      const stoppedAt = Date.now();
      closed = stopping.app.close();
      const stopped = await Promise.race([closed.then(() => true), new Promise((r) => setTimeout(r, 8000, false))]);
      // Held by the upload (the old behaviour): the client gives up, so that the stop can end.
      if (!stopped) upload.req.destroy();
      expect([stopped, Date.now() - stoppedAt < 5000]).toEqual([true, true]);
      const answer = await upload.answer;
      expect([answer.status, answer.body.code, answer.headers['retry-after'], answer.headers.connection]).toEqual([
        503,
        'SERVICE_UNAVAILABLE',
        '1',
        'close',
      ]);
      expect(await other.db.query(`SELECT status FROM issuance_job WHERE id = ?`, [upload.jobId])).toEqual([{ status: 'DISCARDED' }]);
      const retry = await request(other.url)
        .post(`/admin/coupons/${coupon.id}/issuances?reason=r&fromStock=false`)
        .set(bearer(adminToken()))
        .set('Idempotency-Key', key)
        .set('Content-Type', 'text/csv')
        .send('stopping-0\nstopping-1\n');
      expect([retry.status, retry.body.jobId === upload.jobId]).toEqual([202, false]);
      upload.req.destroy();
    } finally {
      await (closed ?? stopping.app.close());
      await stopping.db.destroy();
      await other.close();
    }
  });
});
