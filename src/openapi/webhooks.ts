import { EVENT_TYPES } from '../webhooks/events.js';
import { ID_PATTERN } from '../common/validation.js';
import { USER_COUPON_STATUSES } from '../ledger/transitions.js';
import { type JsonSchema, ref } from './schemas.js';

/** What every delivery carries (docs/webhooks.md): the event as its body, signed Standard Webhooks style. */
export const WEBHOOK_EVENT_SCHEMA: JsonSchema = {
  type: 'object',
  description: 'One state-log move of a user coupon, built once and sent byte for byte on every attempt',
  required: ['id', 'type', 'timestamp', 'data'],
  additionalProperties: false,
  properties: {
    id: {
      type: 'string',
      pattern: `^evt_${ID_PATTERN.source.slice(1)}`,
      description: 'The event id, also the webhook-id header',
      example: 'evt_1024',
    },
    type: { type: 'string', enum: [...EVENT_TYPES] },
    timestamp: {
      type: 'string',
      format: 'date-time',
      description: 'When the move was made: its state-log row’s time, taken in the transaction',
    },
    data: {
      type: 'object',
      required: ['userCoupon', 'from', 'to', 'txId', 'reason'],
      additionalProperties: false,
      properties: {
        userCoupon: {
          oneOf: [ref('UserCoupon'), { type: 'null' }],
          description: 'The coupon as the move left it (`status` is `to`); null if its row is gone',
        },
        from: { type: ['string', 'null'], enum: [...USER_COUPON_STATUSES, null], description: 'The status before (null: issuance)' },
        to: { type: 'string', enum: [...USER_COUPON_STATUSES], description: 'The status after' },
        txId: { type: 'string', description: 'What made the move: grab:<key>, order:<orderNo>, bulk:<jobId>, ...' },
        reason: { type: ['string', 'null'] },
      },
    },
  },
};

const header = (name: string, description: string, schema: JsonSchema) => ({ name, in: 'header', required: true, description, schema });

/**
 * The OpenAPI 3.1 `webhooks` section: one entry per event type, each a POST to the endpoint's URL
 * with the event as body and the Standard Webhooks headers; a 2xx within WEBHOOK_TIMEOUT_MS
 * acknowledges it, anything else is retried.
 */
export function webhooksSection(): Record<string, unknown> {
  return Object.fromEntries(
    EVENT_TYPES.map((type) => [
      type,
      {
        post: {
          operationId: `webhook_${type.replace('.', '_')}`,
          tags: ['webhooks'],
          // Sent by the service, not called on it: the receiver checks the signature, not a token.
          security: [],
          summary: `Event ${type}, delivered to every enabled endpoint subscribed to it`,
          description:
            'At least once (deduplicate on webhook-id), in log order per user coupon. Verify the signature with any Standard Webhooks ' +
            'library and the endpoint secret (`new Webhook(secret).verify(body, headers)`).',
          parameters: [
            header('webhook-id', 'The event id (`evt_<log id>`), the same on every attempt', { type: 'string', example: 'evt_1024' }),
            header('webhook-timestamp', 'Unix seconds of this attempt', { type: 'string', pattern: '^[0-9]{1,12}$' }),
            header('webhook-signature', '`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` with the endpoint secret', {
              type: 'string',
              pattern: '^v1,[A-Za-z0-9+/]+=*$',
            }),
          ],
          requestBody: {
            required: true,
            content: {
              'application/json': {
                schema: {
                  allOf: [ref('WebhookEvent'), { type: 'object', properties: { type: { const: type } } }],
                },
              },
            },
          },
          responses: {
            '2XX': { description: 'Delivered: the receiver has it' },
            default: {
              description: 'Any other answer, or none within WEBHOOK_TIMEOUT_MS: a failed attempt, retried per WEBHOOK_RETRY_DELAYS',
            },
          },
        },
      },
    ]),
  );
}
