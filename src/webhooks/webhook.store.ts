import type { EntityManager } from 'typeorm';
import { EVENT_TYPES, type EventType } from './events.js';
import type { DeliveryStatus, WebhookView } from './webhook.dto.js';

type Db = Pick<EntityManager, 'query'>;

export interface EndpointRow {
  id: string;
  url: string;
  events: string | null;
  description: string | null;
  secret: string;
  enabled: number;
  failed_in_row: number;
  disabled_reason: string | null;
  disabled_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

/** Stored as a comma list; NULL means every type, including types added later. */
export const subscribedTypes = (row: Pick<EndpointRow, 'events'>): readonly EventType[] =>
  row.events === null ? EVENT_TYPES : (row.events.split(',') as EventType[]);

export function toWebhookView(r: EndpointRow): WebhookView {
  return {
    id: String(r.id),
    url: r.url,
    events: [...subscribedTypes(r)],
    description: r.description,
    enabled: Boolean(r.enabled),
    disabledReason: r.disabled_reason,
    disabledAt: r.disabled_at?.toISOString() ?? null,
    failedInRow: Number(r.failed_in_row),
    createdAt: r.created_at.toISOString(),
    updatedAt: r.updated_at.toISOString(),
  };
}

export async function findEndpoint(db: Db, id: string, lock?: 'update' | 'share'): Promise<EndpointRow | undefined> {
  const locking = lock === 'update' ? ' FOR UPDATE' : lock === 'share' ? ' LOCK IN SHARE MODE' : '';
  const rows = (await db.query(`SELECT * FROM webhook_endpoint WHERE id = ?${locking}`, [id])) as EndpointRow[];
  return rows[0];
}

export async function enabledEndpoints(db: Db, shareLock = false): Promise<EndpointRow[]> {
  return (await db.query(
    `SELECT * FROM webhook_endpoint WHERE enabled = 1 ORDER BY id${shareLock ? ' LOCK IN SHARE MODE' : ''}`,
  )) as EndpointRow[];
}

/**
 * `FROM ... WHERE` of the PENDING deliveries (alias p) of earlier events of delivery d's user coupon
 * to d's endpoint: events of a coupon arrive in log order, so d waits while one exists. The one
 * spelling of that rule, for the sender that picks what is due and the list that says what waits.
 */
export const EARLIER_PENDING = `webhook_delivery p FORCE INDEX (idx_coupon_order)
  WHERE p.endpoint_id = d.endpoint_id AND p.user_coupon_id = d.user_coupon_id AND p.log_id < d.log_id AND p.status = 'PENDING'`;

export interface DeliveryRow {
  id: string;
  endpoint_id: string;
  log_id: string;
  user_coupon_id: string;
  event_type: EventType;
  payload: string;
  status: DeliveryStatus;
  attempts: number;
  next_attempt_at: Date | null;
  last_status_code: number | null;
  last_error: string | null;
  created_at: Date;
  delivered_at: Date | null;
}
