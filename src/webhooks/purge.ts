import type { DataSource } from 'typeorm';
import type { TransactionService } from '../database/transaction.service.js';

/** Deliveries removed per transaction: short enough that the sender's writes never queue long behind one. */
export const PURGE_BATCH = 500;

/**
 * Removes the deliveries (and their attempts) of deleted endpoints, a batch per transaction.
 * DELETE /admin/webhooks/:id removes only the endpoint's row: its deliveries went in the same
 * transaction once, and an endpoint that had piled up a few hundred thousand (a receiver down through
 * a sale) could not be deleted at all, since that DELETE outlived the request's deadline and rolled
 * back. Their endpoint gone, the rows are never sent nor listed again, so removing them later is
 * not seen by anyone; finding them from the data, not from a list kept in memory, finishes the work
 * after a crash too.
 */
export class DeliveryPurge {
  /** Deleted endpoints with deliveries left, as last found. */
  private left: string[] = [];

  constructor(
    private readonly dataSource: DataSource,
    private readonly tx: TransactionService,
  ) {}

  /** One batch; true while more remain. */
  async step(): Promise<boolean> {
    if (this.left.length === 0) this.left = await this.deletedEndpoints();
    const endpointId = this.left[0];
    if (endpointId === undefined) return false;
    const removed = await this.tx.inTransaction(async (em) => {
      // Gone for this transaction too, whatever the read that listed it saw (a node of a cluster behind on the endpoint's creation).
      if (((await em.query(`SELECT id FROM webhook_endpoint WHERE id = ? LOCK IN SHARE MODE`, [endpointId])) as unknown[]).length > 0)
        return null;
      // In (endpoint_id, log_id) order: the unique key's own order, so the LIMIT bounds what is read and locked.
      const rows = (await em.query(`SELECT id FROM webhook_delivery WHERE endpoint_id = ? ORDER BY log_id LIMIT ? FOR UPDATE`, [
        endpointId,
        PURGE_BATCH,
      ])) as { id: string }[];
      if (rows.length === 0) return 0;
      await em.query(`DELETE FROM webhook_delivery_attempt WHERE delivery_id IN (?)`, [rows.map((r) => r.id)]);
      // The same rows, by the same index walk: by their ids, the server may scan the whole table and
      // wait on a lock the sender holds on a row of another batch.
      await em.query(`DELETE FROM webhook_delivery WHERE endpoint_id = ? ORDER BY log_id LIMIT ?`, [endpointId, rows.length]);
      return rows.length;
    });
    if (removed === null || removed < PURGE_BATCH) this.left.shift();
    return this.left.length > 0;
  }

  /**
   * Endpoint ids that have deliveries and no row: one index dive per endpoint id among the deliveries
   * (a GROUP BY is read loosely only when the table's statistics allow it). The endpoints are read
   * after the deliveries, so one created meanwhile is never taken for deleted; ids are never reused.
   */
  private async deletedEndpoints(): Promise<string[]> {
    const db = this.dataSource.manager;
    const seen: string[] = [];
    for (;;) {
      const [next] = (await db.query(`SELECT endpoint_id FROM webhook_delivery WHERE endpoint_id > ? ORDER BY endpoint_id LIMIT 1`, [
        seen[seen.length - 1] ?? 0,
      ])) as { endpoint_id: string }[];
      if (!next) break;
      seen.push(String(next.endpoint_id));
    }
    if (seen.length === 0) return [];
    const live = (await db.query(`SELECT id FROM webhook_endpoint WHERE id IN (?)`, [seen])) as { id: string }[];
    const kept = new Set(live.map((r) => String(r.id)));
    return seen.filter((id) => !kept.has(id));
  }
}
