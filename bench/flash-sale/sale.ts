import { signToken } from '../../src/auth/jwt.js';
import type { LoadGenerator, Shot } from './load.js';
import { createCoupon } from './run-design.js';
import { answerViolations } from './verify.js';

/** One user coupon won in a grab, and the order it goes on. */
export interface Winner {
  userId: string;
  /** The user's own token, for their own reads ("my coupons"). */
  authorization: string;
  userCouponId: string;
  orderNo: string;
}

/** A shopper's token, valid for the whole benchmark. */
export const userToken = (jwtSecret: string, userId: string) => `Bearer ${signToken(jwtSecret, userId, [], 4 * 3600)}`;

/** `n` distinct users grab one coupon each of a fresh coupon with `n` stock: the sale before a checkout. */
export async function saleWinners(
  url: string,
  load: LoadGenerator,
  auth: { admin: string; jwtSecret: string },
  prefix: string,
  n: number,
): Promise<Winner[]> {
  const couponId = await createCoupon(url, auth.admin, n);
  const shots: Shot[] = Array.from({ length: n }, (_, i) => ({
    userId: `${prefix}-u${i}`,
    key: `${prefix}-k${i}`,
    authorization: userToken(auth.jwtSecret, `${prefix}-u${i}`),
  }));
  const grabbed = await load.fire(`/coupons/${couponId}/grab`, shots);
  const won = grabbed.answers.filter((a) => a.status === 201 && a.id !== null);
  if (won.length !== n)
    throw new Error(`${prefix}: ${won.length} of ${n} grabs issued a coupon: ${answerViolations(grabbed.answers, ['SUCCESS']).join('; ')}`);
  return grabbed.answers.map((a) => ({
    userId: shots[a.shot].userId,
    authorization: shots[a.shot].authorization,
    userCouponId: a.id as string,
    orderNo: `${prefix}-order-${a.shot}`,
  }));
}
