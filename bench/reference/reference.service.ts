import { Injectable } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { CouponService } from '../../src/coupon/coupon.service.js';
import { IssueService, soldOutError, userLimitReached, validityWindow } from '../../src/ledger/issue.service.js';
import { UserCoupon } from '../../src/ledger/user-coupon.entity.js';
import { writeLog } from '../../src/ledger/state-log.js';
import { TxIds } from '../../src/ledger/tx-id.js';
import { countTowardsLimit } from '../../src/ledger/user-coupons.js';

type Queryable = Pick<DataSource['manager'], 'query'>;

async function grabbedBy(db: Queryable, couponId: string, userId: string): Promise<number> {
  return (await countTowardsLimit(db, couponId, [userId])).get(userId) ?? 0;
}

/**
 * The designs the shipped grab path replaces, for side-by-side measurement only. Both read the
 * coupon template through the same cache as the shipped path, so the comparison is about how stock
 * and issuance are written, not about template lookups.
 */
@Injectable()
export class ReferenceDesigns {
  constructor(
    private readonly dataSource: DataSource,
    private readonly coupons: CouponService,
    private readonly issuer: IssueService,
  ) {}

  /**
   * The seed article's starting point: read the stock, check it, then write, each statement in its
   * own autocommit. Two requests that both read stock = 1 both issue: it oversells, and it is here
   * to show by how much.
   */
  async readThenWrite(couponId: string, userId: string, key: string): Promise<UserCoupon> {
    const coupon = await this.coupons.template(couponId);
    const db = this.dataSource.manager;
    const [row] = (await db.query(`SELECT stock FROM coupon_stock WHERE coupon_id = ?`, [couponId])) as { stock: string }[];
    if (!row || Number(row.stock) <= 0) throw soldOutError(couponId);
    if ((await grabbedBy(db, couponId, userId)) >= coupon.perUserLimit) throw userLimitReached(coupon.perUserLimit);
    await db.query(`UPDATE coupon_stock SET stock = stock - 1, updated_at = ? WHERE coupon_id = ?`, [new Date(), couponId]);
    const now = new Date();
    const { validFrom, expiresAt } = validityWindow(coupon, now);
    const res = (await db.query(
      `INSERT INTO user_coupon (coupon_id, user_id, status, source, from_stock, idempotency_key, issued_at, valid_from, expires_at, updated_at)
       VALUES (?, ?, 'UNUSED', 'GRAB', 1, ?, ?, ?, ?, ?)`,
      [couponId, userId, key, now, validFrom, expiresAt, now],
    )) as { insertId: number | string };
    const id = String(res.insertId);
    await writeLog(db, [{ userCouponId: id, from: null, to: 'UNUSED', txId: TxIds.grab(key), reason: 'GRAB', at: now }]);
    return Object.assign(new UserCoupon(), {
      id,
      couponId,
      userId,
      status: 'UNUSED',
      source: 'GRAB',
      issuedAt: now,
      validFrom,
      expiresAt,
      usedAt: null,
    });
  }

  /**
   * The seed article's fix: one transaction per request around the conditional stock UPDATE, the
   * coupon row and its log row, plus the per-user count under the stock row lock. No idempotency
   * lookup, no limiter, no sold-out memo, no deadlock retry.
   */
  async txConditional(couponId: string, userId: string, key: string): Promise<UserCoupon> {
    const coupon = await this.coupons.template(couponId);
    return this.dataSource.transaction('READ COMMITTED', (em) => this.issuer.grab(em, coupon, userId, key));
  }
}
