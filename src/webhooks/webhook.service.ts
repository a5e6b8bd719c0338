import { randomBytes } from 'node:crypto';
import { Injectable } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { AppError } from '../common/errors.js';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { AppConfig, parseAllowedHosts } from '../config/app-config.js';
import { execute, TransactionService } from '../database/transaction.service.js';
import { eventId } from './events.js';
import { checkWebhookUrl } from './url-policy.js';
import type {
  AttemptView,
  CreatedWebhookView,
  CreateWebhookDto,
  DeliveryPage,
  ListDeliveriesQuery,
  UpdateWebhookDto,
  WebhookView,
} from './webhook.dto.js';
import { DeliveryRow, EndpointRow, findEndpoint, toWebhookView } from './webhook.store.js';

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
      const row = await findEndpoint(em, id, true);
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

  async remove(id: string): Promise<void> {
    await this.tx.inTransaction(async (em) => {
      if ((await execute(em, `DELETE FROM webhook_endpoint WHERE id = ?`, [id])) === 0) throw notFound(id);
      await em.query(`DELETE a FROM webhook_delivery_attempt a JOIN webhook_delivery d ON d.id = a.delivery_id WHERE d.endpoint_id = ?`, [
        id,
      ]);
      await em.query(`DELETE FROM webhook_delivery WHERE endpoint_id = ?`, [id]);
    });
  }

  /** Newest first; each delivery with every attempt it has had. */
  async deliveries(id: string, q: ListDeliveriesQuery): Promise<DeliveryPage> {
    if (!(await findEndpoint(this.dataSource, id))) throw notFound(id);
    const limit = q.limit ?? DEFAULT_PAGE_LIMIT;
    const rows = (await this.dataSource.query(
      `SELECT id, log_id, user_coupon_id, event_type, status, attempts, next_attempt_at, last_status_code, last_error, created_at, delivered_at
       FROM webhook_delivery WHERE endpoint_id = ? AND (? IS NULL OR status = ?) AND (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?`,
      [id, q.status ?? null, q.status ?? null, q.cursor ?? null, q.cursor ?? null, limit + 1],
    )) as DeliveryRow[];
    const page = rows.slice(0, limit);
    const attempts = new Map<string, AttemptView[]>();
    if (page.length > 0) {
      const found = (await this.dataSource.query(
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
        createdAt: r.created_at.toISOString(),
        deliveredAt: r.delivered_at?.toISOString() ?? null,
        attempts: attempts.get(String(r.id)) ?? [],
      })),
      nextCursor: rows.length > limit ? String(page[page.length - 1].id) : null,
    };
  }
}
