import { Injectable } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { AppError } from '../common/errors.js';
import { execute } from '../database/transaction.service.js';
import { CouponStock } from './coupon-stock.entity.js';

type Queryable = Pick<EntityManager, 'query'>;
export type StockRow = Pick<CouponStock, 'initStock' | 'stock'>;

async function readStock(em: Queryable, sql: string, couponId: string): Promise<StockRow | null> {
  const [r] = (await em.query(sql, [couponId])) as { init_stock: string; stock: string }[];
  return r ? { initStock: Number(r.init_stock), stock: Number(r.stock) } : null;
}

/**
 * Every statement on coupon_stock. Every change is one conditional UPDATE whose affected-row
 * count says whether it happened; nothing here reads a counter and writes it back.
 */
@Injectable()
export class StockService {
  async create(em: EntityManager, couponId: string, initStock: number, at: Date): Promise<void> {
    await em.query(`INSERT INTO coupon_stock (coupon_id, init_stock, stock, updated_at) VALUES (?, ?, ?, ?)`, [
      couponId,
      initStock,
      initStock,
      at,
    ]);
  }

  /** Takes `count` units if that many remain. Returns false (and changes nothing) otherwise. */
  async deduct(em: EntityManager, couponId: string, count: number, at = new Date()): Promise<boolean> {
    return (
      (await execute(em, `UPDATE coupon_stock SET stock = stock - ?, updated_at = ? WHERE coupon_id = ? AND stock >= ?`, [
        count,
        at,
        couponId,
        count,
      ])) === 1
    );
  }

  /**
   * An admin's stock change: adds to (or removes from) both the initial and the remaining stock, so
   * init_stock == stock + issued keeps holding. Removing more than remains is INSUFFICIENT_STOCK, and
   * so is removing more than was ever created, which only a row edited by hand can remain (its
   * total would go negative). An addition always goes through: to stock a hand edit left negative,
   * it is the repair reconciliation's report asks of an admin, however little it adds.
   */
  async adjust(em: EntityManager, couponId: string, delta: number, at = new Date()): Promise<void> {
    const changed = await execute(
      em,
      `UPDATE coupon_stock SET stock = stock + ?, init_stock = init_stock + ?, updated_at = ?
       WHERE coupon_id = ? AND (? > 0 OR (stock + ? >= 0 AND init_stock + ? >= 0))`,
      [delta, delta, at, couponId, delta, delta, delta],
    );
    if (changed === 1) return;
    const row = await this.find(em, couponId);
    if (!row) throw new AppError('COUPON_NOT_FOUND', `Coupon ${couponId} has no stock row; reconciliation proposes to recreate it`);
    // What remains is what an operator sees and the usual reason; the total only after a hand edit.
    if (row.stock + delta < 0)
      throw new AppError('INSUFFICIENT_STOCK', `Cannot remove ${-delta} units: only ${row.stock} remain`, {
        delta,
        remainingStock: row.stock,
      });
    if (row.initStock + delta < 0)
      throw new AppError('INSUFFICIENT_STOCK', `Cannot remove ${-delta} units: only ${row.initStock} were ever created`, {
        delta,
        initStock: row.initStock,
      });
    // Read after the refusal: stock added in between can make it look enough now.
    throw new AppError('INSUFFICIENT_STOCK', `Cannot remove ${-delta} units: fewer remained`, { delta });
  }

  /** Reconciliation's approved "recreate stock" for a coupon whose row is gone: sold out, balanced with what was issued. */
  async recreate(em: EntityManager, couponId: string, issuedFromStock: number, at: Date): Promise<void> {
    await em.query(`INSERT INTO coupon_stock (coupon_id, init_stock, stock, updated_at) VALUES (?, ?, 0, ?)`, [
      couponId,
      issuedFromStock,
      at,
    ]);
  }

  /** Reconciliation's approved "adopt issued": more was issued than the initial stock, so the sale ends at what was issued. */
  async adopt(em: EntityManager, couponId: string, issuedFromStock: number, at: Date): Promise<void> {
    await execute(em, `UPDATE coupon_stock SET init_stock = ?, stock = 0, updated_at = ? WHERE coupon_id = ?`, [
      issuedFromStock,
      at,
      couponId,
    ]);
  }

  /** Puts units back (reconciliation's approved "restore stock"): remaining stock only. */
  async restore(em: EntityManager, couponId: string, count: number, at = new Date()): Promise<void> {
    await execute(em, `UPDATE coupon_stock SET stock = stock + ?, updated_at = ? WHERE coupon_id = ?`, [count, at, couponId]);
  }

  /** The stock of each of these coupons (absent ones left out), in one query. */
  async findMany(em: Queryable, couponIds: readonly string[]): Promise<Map<string, StockRow>> {
    if (couponIds.length === 0) return new Map();
    const rows = (await em.query(`SELECT coupon_id, init_stock, stock FROM coupon_stock WHERE coupon_id IN (?)`, [couponIds])) as {
      coupon_id: string;
      init_stock: string;
      stock: string;
    }[];
    return new Map(rows.map((r) => [String(r.coupon_id), { initStock: Number(r.init_stock), stock: Number(r.stock) }]));
  }

  async find(em: Queryable, couponId: string): Promise<StockRow | null> {
    return readStock(em, `SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ?`, couponId);
  }

  /** Remaining stock of the coupons a sale dashboard shows (grab window open, or ended within a day), for the metrics scrape. */
  async remainingOfCurrent(em: Queryable): Promise<{ couponId: string; stock: number }[]> {
    const rows = (await em.query(
      `SELECT s.coupon_id, s.stock FROM coupon_stock s JOIN coupon c ON c.id = s.coupon_id WHERE c.grab_end_at > NOW(3) - INTERVAL 1 DAY`,
    )) as { coupon_id: string; stock: string }[];
    return rows.map((r) => ({ couponId: r.coupon_id, stock: Number(r.stock) }));
  }

  /**
   * Locks the stock row (FOR UPDATE) and reads it: every grab of the coupon, grouped or not, waits
   * for the holder, so what the holder reads about the coupon's grabs cannot change under it.
   */
  async lock(em: Queryable, couponId: string): Promise<StockRow | null> {
    return readStock(em, `SELECT init_stock, stock FROM coupon_stock WHERE coupon_id = ? FOR UPDATE`, couponId);
  }
}
