import request from 'supertest';
import { couponBody, type CouponInput } from './coupon-body.js';
import { adminToken, bearer, tokenFor } from './harness.js';

export type { CouponInput };
export { couponBody };

export interface CouponView {
  id: string;
  initStock: number;
  remainingStock: number;
  [k: string]: unknown;
}

/** Ids of every coupon createCoupon made in this test file, in order (what the scoped invariant checks look at). */
export const createdCoupons: string[] = [];

/** Creates a coupon through the admin API, as an operator would. */
export async function createCoupon(url: string, overrides: CouponInput = {}): Promise<CouponView> {
  const res = await request(url).post('/admin/coupons').set(bearer(adminToken())).send(couponBody(overrides));
  if (res.status !== 201) throw new Error(`createCoupon: ${res.status} ${JSON.stringify(res.body)}`);
  createdCoupons.push((res.body as CouponView).id);
  return res.body as CouponView;
}

let keySeq = 0;
export const newKey = (prefix = 'k') => `${prefix}-${process.pid}-${Date.now()}-${++keySeq}`;

/** The Authorization header of a user token (any valid token is a user). */
export const asUser = (userId: string) => bearer(tokenFor(userId));

/** A grab as the user's client sends it; the answer is the caller's to check. */
export const grabRequest = (url: string, couponId: string, userId: string, key = newKey()) =>
  request(url).post(`/coupons/${couponId}/grab`).set(asUser(userId)).set('Idempotency-Key', key);

export interface UserCouponBody {
  id: string;
  couponId: string;
  userId: string;
  status: string;
  [k: string]: unknown;
}

/** A user coupon of `userId`, grabbed through the API. */
export async function grabUserCoupon(url: string, couponId: string, userId: string, key = newKey()): Promise<UserCouponBody> {
  const res = await grabRequest(url, couponId, userId, key);
  if (res.status !== 201) throw new Error(`grabUserCoupon: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body as UserCouponBody;
}

/** A user coupon of `userId` on a coupon of its own (50 stock, 50 per user unless overridden), grabbed through the API. */
export async function newUserCoupon(url: string, userId: string, overrides: CouponInput = {}): Promise<UserCouponBody> {
  const coupon = await createCoupon(url, { totalStock: 50, perUserLimit: 50, ...overrides });
  return grabUserCoupon(url, coupon.id, userId);
}

/** The user's coupon redeemed on an order through the API, as the user's own client does it. */
export async function redeemUserCoupon(
  url: string,
  userCouponId: string,
  userId: string,
  order: { orderNo?: string; orderAmountCents?: number } = {},
): Promise<{ redemptionId: string; orderNo: string; [k: string]: unknown }> {
  const body = { userCouponId, orderNo: order.orderNo ?? newKey('ORD'), orderAmountCents: order.orderAmountCents ?? 20_000 };
  const res = await request(url).post('/redemptions').set(asUser(userId)).send(body);
  if (res.status !== 201) throw new Error(`redeemUserCoupon: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body as { redemptionId: string; orderNo: string };
}
