import { randomBytes } from 'node:crypto';
import { Injectable } from '@nestjs/common';
import { DataSource, EntityManager } from 'typeorm';
import { AppError } from '../common/errors.js';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { AppConfig, parseAllowedHosts } from '../config/app-config.js';
import { execute, readSnapshot, TransactionService } from '../database/transaction.service.js';
import { eventId } from './events.js';
import { checkWebhookUrl } from './url-policy.js';
import type {
  AttemptView,
  CreatedWebhookView,
  CreateWebhookDto,
  DeliveryPage,
  ListDeliveriesQuery,
  RedeliverDto,
  RedeliveryView,
  UpdateWebhookDto,
  WebhookView,
} from './webhook.dto.js';
import { DeliveryRow, EARLIER_PENDING, EndpointRow, findEndpoint, toWebhookView } from './webhook.store.js';

/** Deliveries made due again per transaction when every FAILED one of an endpoint is sent again. */
const REDELIVER_BATCH = 1000;

const notFound = (id: string) => new AppError('WEBHOOK_NOT_FOUND', `Webhook ${id} does not exist`, { webhookId: id });

/** The admin side of webhooks: endpoints and their deliveries. */
@Injectable()
export class WebhookService {
  private readonly allowedHosts: string[];

  constructor(
    private readonly tx: TransactionService,
    private readonly dataSource: DataSource,
    config: AppConfig,
  ) {
    this.allowedHosts = parseAllowedHosts(config.WEBHOOK_ALLOWED_HOSTS);
  }

  async create(dto: CreateWebhookDto): Promise<CreatedWebhookView> {
    const url = checkWebhookUrl(dto.url, this.allowedHosts);
    // The format the standardwebhooks package reads: whsec_ and the base64 of the key.
    const secret = `whsec_${randomBytes(32).toString('base64')}`;
    const now = new Date();
    const row = await this.tx.inTransaction(async (em) => {
      const res = (await em.query(
        `INSERT INTO webhook_endpoint (url, events, description, secret, enabled, created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?)`,
        [url, dto.events?.join(',') ?? null, dto.description ?? null, secret, now, now],
      )) as { insertId: number | string };
      return (await findEndpoint(em, String(res.insertId))) as EndpointRow;
    });
    return { ...toWebhookView(row), secret };
  }

  async list(): Promise<WebhookView[]> {
    const rows = (await this.dataSource.query(`SELECT * FROM webhook_endpoint ORDER BY id`)) as EndpointRow[];
    return rows.map(toWebhookView);
  }

  async get(id: string): Promise<WebhookView> {
    const row = await findEndpoint(this.dataSource, id);
    if (!row) throw notFound(id);
    return toWebhookView(row);
  }

  async update(id: string, dto: UpdateWebhookDto): Promise<WebhookView> {
    if (dto.url === undefined && dto.events === undefined && dto.enabled === undefined) {
      throw new AppError('VALIDATION_FAILED', 'Nothing to change', { fields: { body: ['give at least one of url, events, enabled'] } });
    }
    const url = dto.url === undefined ? undefined : checkWebhookUrl(dto.url, this.allowedHosts);
    return this.tx.inTransaction(async (em) => {
      const row = await findEndpoint(em, id, 'update');
      if (!row) throw notFound(id);
      const set: Record<string, unknown> = { updated_at: new Date() };
      if (url !== undefined) set.url = url;
      if (dto.events !== undefined) set.events = dto.events.join(',');
      if (dto.enabled !== undefined) set.enabled = dto.enabled;
      // Turned on again by an operator: the failures that disabled it are forgiven.
      if (dto.enabled) Object.assign(set, { failed_in_row: 0, disabled_reason: null, disabled_at: null });
      const columns = Object.keys(set);
      await em.query(`UPDATE webhook_endpoint SET ${columns.map((c) => `${c} = ?`).join(', ')} WHERE id = ?`, [
        ...columns.map((c) => set[c]),
        id,
      ]);
      return toWebhookView((await findEndpoint(em, id)) as EndpointRow);
    });
  }

  /** The endpoint's row alone: the relay removes its deliveries afterwards, in batches (purge.ts). */
  async remove(id: string): Promise<void> {
    await this.tx.inTransaction(async (em) => {
      if ((await execute(em, `DELETE FROM webhook_endpoint WHERE id = ?`, [id])) === 0) throw notFound(id);
    });
  }

  /**
   * Newest first; each delivery with every attempt it has had. Read in one snapshot: otherwise an
   * attempt written between the two reads shows beside the status it has since changed.
   */
  deliveries(id: string, q: ListDeliveriesQuery): Promise<DeliveryPage> {
    return readSnapshot(this.dataSource, (em) => this.readDeliveries(em, id, q));
  }

  private async readDeliveries(em: EntityManager, id: string, q: ListDeliveriesQuery): Promise<DeliveryPage> {
    if (!(await findEndpoint(em, id))) throw notFound(id);
    const limit = q.limit ?? DEFAULT_PAGE_LIMIT;
    const rows = (await em.query(
      `SELECT d.id, d.log_id, d.user_coupon_id, d.event_type, d.status, d.attempts, d.next_attempt_at, d.last_status_code, d.last_error,
              d.created_at, d.delivered_at,
              CASE WHEN d.status = 'PENDING' THEN (SELECT p.id FROM ${EARLIER_PENDING} ORDER BY p.log_id LIMIT 1) END AS held_back_by
       FROM webhook_delivery d WHERE d.endpoint_id = ? AND (? IS NULL OR d.status = ?) AND (? IS NULL OR d.id < ?) ORDER BY d.id DESC LIMIT ?`,
      [id, q.status ?? null, q.status ?? null, q.cursor ?? null, q.cursor ?? null, limit + 1],
    )) as (DeliveryRow & { held_back_by: string | null })[];
    const page = rows.slice(0, limit);
    const attempts = new Map<string, AttemptView[]>();
    if (page.length > 0) {
      const found = (await em.query(
        `SELECT delivery_id, attempted_at, status_code, error, duration_ms FROM webhook_delivery_attempt
         WHERE delivery_id IN (${page.map(() => '?').join(', ')}) ORDER BY id`,
        page.map((r) => r.id),
      )) as { delivery_id: string; attempted_at: Date; status_code: number | null; error: string | null; duration_ms: number }[];
      for (const a of found) {
        const list = attempts.get(String(a.delivery_id)) ?? [];
        list.push({
          attemptedAt: a.attempted_at.toISOString(),
          statusCode: a.status_code,
          error: a.error,
          durationMs: Number(a.duration_ms),
        });
        attempts.set(String(a.delivery_id), list);
      }
    }
    return {
      items: page.map((r) => ({
        id: String(r.id),
        eventId: eventId(String(r.log_id)),
        type: r.event_type,
        userCouponId: String(r.user_coupon_id),
        status: r.status,
        attemptCount: Number(r.attempts),
        lastStatusCode: r.last_status_code,
        lastError: r.last_error,
        nextAttemptAt: r.status === 'PENDING' && r.next_attempt_at ? r.next_attempt_at.toISOString() : null,
        heldBackBy: r.held_back_by === null ? null : String(r.held_back_by),
        createdAt: r.created_at.toISOString(),
        deliveredAt: r.delivered_at?.toISOString() ?? null,
        attempts: attempts.get(String(r.id)) ?? [],
      })),
      nextCursor: rows.length > limit ? String(page[page.length - 1].id) : null,
    };
  }

  /**
   * Sends deliveries again (an operator's resend, after a receiver's outage outlasted the retries,
   * or its bug dropped what it was sent): each becomes PENDING and due now, for one attempt, not the
   * retry schedule again (final_attempt; a failure makes it FAILED at once). Named ones may be FAILED or DELIVERED;
   * without names, every FAILED one goes, in batches of their own transactions. One already PENDING
   * is on its way and left alone. Events reach the receiver under their first webhook-id, possibly
   * after later events of the same coupon.
   */
  async redeliver(id: string, dto: RedeliverDto): Promise<RedeliveryView> {
    const now = new Date();
    const due = (em: EntityManager, ids: readonly string[]) =>
      ids.length === 0
        ? Promise.resolve(0)
        : execute(
            em,
            `UPDATE webhook_delivery SET status = 'PENDING', next_attempt_at = ?, delivered_at = NULL, final_attempt = 1
             WHERE endpoint_id = ? AND status <> 'PENDING' AND id IN (?)`,
            [now, id, ids],
          );
    // Share-locked, so that a removal of the endpoint waits (or is waited for) and is answered as such,
    // not as deliveries missing or a count of deleted ones.
    const endpointHeld = async (em: EntityManager) => {
      if (!(await findEndpoint(em, id, 'share'))) throw notFound(id);
    };
    const named = dto.deliveryIds;
    if (named) {
      return this.tx.inTransaction(async (em) => {
        await endpointHeld(em);
        const found = (await em.query(`SELECT id FROM webhook_delivery WHERE endpoint_id = ? AND id IN (?) FOR UPDATE`, [id, named])) as {
          id: string;
        }[];
        const ours = new Set(found.map((r) => String(r.id)));
        const missing = named.filter((d) => !ours.has(d));
        if (missing.length > 0)
          throw new AppError('WEBHOOK_DELIVERY_NOT_FOUND', `Webhook ${id} has no delivery ${missing.join(', ')}`, {
            webhookId: id,
            deliveryIds: missing,
          });
        return { redelivered: await due(em, named) };
      });
    }
    // By id from where the last batch ended: a delivery failing again meanwhile is not taken twice.
    let after = '0';
    let redelivered = 0;
    for (;;) {
      const batch = await this.tx.inTransaction(async (em) => {
        await endpointHeld(em);
        // next_attempt_at IS NULL (as on every FAILED one) lets idx_due hand the rows over in id order,
        // so the LIMIT bounds what is read and locked.
        const rows = (await em.query(
          `SELECT id FROM webhook_delivery WHERE endpoint_id = ? AND status = 'FAILED' AND next_attempt_at IS NULL AND id > ?
           ORDER BY id LIMIT ? FOR UPDATE`,
          [id, after, REDELIVER_BATCH],
        )) as { id: string }[];
        const ids = rows.map((r) => String(r.id));
        return { ids, changed: await due(em, ids) };
      });
      redelivered += batch.changed;
      if (batch.ids.length < REDELIVER_BATCH) return { redelivered };
      after = batch.ids[batch.ids.length - 1];
    }
  }
}
