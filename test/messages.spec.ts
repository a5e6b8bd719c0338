// Accept-Language: zh-CN answers Chinese messages for the same codes; English otherwise.
import request from 'supertest';
import { ERROR_STATUS, ErrorCode } from '../src/common/errors.js';
import { CATALOGUES, languageOf, messageFor } from '../src/common/messages.js';
import { createCoupon, newKey } from './support/factories.js';
import { bearer, serviceToken, startTestApp, TestApp, tokenFor } from './support/harness.js';

const CJK = /[\u4e00-\u9fff]/;

describe('catalogues', () => {
  it.each(Object.keys(CATALOGUES))('%s has a message for every error code, and no other keys', (language) => {
    const catalogue = CATALOGUES[language as keyof typeof CATALOGUES] as Record<string, string>;
    expect(Object.keys(catalogue).sort()).toEqual(Object.keys(ERROR_STATUS).sort());
    for (const code of Object.keys(ERROR_STATUS) as ErrorCode[]) {
      expect([code, CJK.test(messageFor(code, 'zh-CN', 'english'))]).toEqual([code, true]);
    }
  });

  it('the flash-sale wording shoppers know', () => {
    expect(messageFor('SOLD_OUT', 'zh-CN', '')).toBe('已抢光');
    expect(messageFor('RATE_LIMITED', 'zh-CN', '')).toBe('手慢了，再试试');
    expect(messageFor('SOLD_OUT', 'en', 'This coupon is sold out')).toBe('This coupon is sold out');
  });

  it.each([
    [undefined, 'en'],
    ['', 'en'],
    ['zh-CN', 'zh-CN'],
    ['zh-cn', 'zh-CN'],
    ['zh', 'zh-CN'],
    ['zh-TW,zh;q=0.9', 'zh-CN'],
    ['zh-Hans-CN', 'zh-CN'],
    ['en-US,en;q=0.9,zh-CN;q=0.8', 'en'],
    ['fr-FR,zh-CN;q=0.5', 'zh-CN'],
    ['zh-CN;q=0,en', 'en'],
    ['fr', 'en'],
    ['*', 'en'],
  ])('Accept-Language %p answers %s', (header, language) => {
    expect(languageOf(header)).toBe(language);
  });
});

describe('answers', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  const zh = { 'Accept-Language': 'zh-CN,zh;q=0.9,en;q=0.8' };
  const grab = (couponId: string, user: string, headers: Record<string, string> = {}) =>
    request(t.url)
      .post(`/coupons/${couponId}/grab`)
      .set(bearer(tokenFor(user)))
      .set('Idempotency-Key', newKey())
      .set(headers);

  it('grab refusals: same code and details, Chinese message and Content-Language with zh-CN, English without', async () => {
    const soldOut = await createCoupon(t.url, { totalStock: 1 });
    expect((await grab(soldOut.id, 'zh-a')).status).toBe(201);
    const chinese = await grab(soldOut.id, 'zh-b', zh);
    const english = await grab(soldOut.id, 'zh-c');
    expect([chinese.status, chinese.body.code, chinese.body.message]).toEqual([409, 'SOLD_OUT', '已抢光']);
    expect(chinese.headers['content-language']).toBe('zh-CN');
    expect([english.status, english.body.code, english.body.message]).toEqual([409, 'SOLD_OUT', expect.stringMatching(/sold out/)]);
    expect(english.headers['content-language']).toBeUndefined();
    expect(chinese.body.details).toEqual(english.body.details);

    const limited = await createCoupon(t.url, { totalStock: 5, perUserLimit: 1 });
    expect((await grab(limited.id, 'zh-d')).status).toBe(201);
    const again = await grab(limited.id, 'zh-d', zh);
    expect([again.body.code, again.body.message]).toEqual(['USER_LIMIT_REACHED', messageFor('USER_LIMIT_REACHED', 'zh-CN', '')]);

    const later = await createCoupon(t.url, {
      grabStartAt: new Date(Date.now() + 3600_000).toISOString(),
      grabEndAt: new Date(Date.now() + 7200_000).toISOString(),
    });
    const early = await grab(later.id, 'zh-e', zh);
    expect([early.body.code, CJK.test(early.body.message)]).toEqual(['GRAB_NOT_STARTED', true]);
    const missing = await grab('999999999', 'zh-e', zh);
    expect([missing.status, missing.body.code, CJK.test(missing.body.message)]).toEqual([404, 'COUPON_NOT_FOUND', true]);
  });

  it('my coupons, redemption, validation and authentication answer in Chinese too', async () => {
    const mine = await request(t.url)
      .get('/me/coupons/999999999')
      .set(bearer(tokenFor('zh-f')))
      .set(zh);
    expect([mine.status, mine.body.code, CJK.test(mine.body.message)]).toEqual([404, 'USER_COUPON_NOT_FOUND', true]);

    const coupon = await createCoupon(t.url, { discount: { thresholdCents: 10_000, amountCents: 1000 } });
    const got = await grab(coupon.id, 'zh-g');
    const redeem = await request(t.url)
      .post('/redemptions')
      .set(bearer(serviceToken()))
      .set(zh)
      .send({ userCouponId: got.body.id, orderNo: 'zh-order-1', orderAmountCents: 500, userId: 'zh-g' });
    expect([redeem.status, redeem.body.code, redeem.body.message]).toEqual([
      422,
      'THRESHOLD_NOT_MET',
      messageFor('THRESHOLD_NOT_MET', 'zh-CN', ''),
    ]);

    const invalid = await request(t.url)
      .get('/me/coupons?limit=0')
      .set(bearer(tokenFor('zh-g')))
      .set(zh);
    expect([invalid.status, invalid.body.code, CJK.test(invalid.body.message), invalid.body.details]).toEqual([
      400,
      'VALIDATION_FAILED',
      true,
      expect.any(Object),
    ]);
    const anonymous = await request(t.url).get('/me/coupons').set(zh);
    expect([anonymous.status, anonymous.body.code, CJK.test(anonymous.body.message)]).toEqual([401, 'UNAUTHENTICATED', true]);
  });

  it('a successful answer is the same whatever the language', async () => {
    const coupon = await createCoupon(t.url, { totalStock: 3 });
    const res = await grab(coupon.id, 'zh-h', zh);
    expect(res.status).toBe(201);
    expect(res.headers['content-language']).toBeUndefined();
  });
});
