import { applyDecorators } from '@nestjs/common';
import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { ArrayMaxSize, ArrayMinSize, ArrayUnique, IsArray, IsBoolean, IsIn, IsString, Matches } from 'class-validator';
import { DISPLAY_TEXT, ID_PATTERN, IsOmittable, TextLength } from '../common/validation.js';
import { PageQuery } from '../common/page.js';
import { EVENT_TYPES, type EventType } from './events.js';
import { URL_MAX_LENGTH } from './url-policy.js';

export const DELIVERY_STATUSES = ['PENDING', 'DELIVERED', 'FAILED'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

const URL_DOC = {
  maxLength: URL_MAX_LENGTH,
  pattern: '^[hH][tT][tT][pP][sS]?:',
  example: 'https://hooks.example.com/coupons',
  description:
    'http or https, no credentials; when WEBHOOK_ALLOWED_HOSTS is set its host must be listed (else 422 WEBHOOK_URL_NOT_ALLOWED)',
};
/** A list of event types: at least one, no repeats. */
const EventsField = () =>
  applyDecorators(
    IsOmittable(),
    IsArray(),
    ArrayMinSize(1),
    ArrayMaxSize(EVENT_TYPES.length),
    ArrayUnique(),
    IsIn(EVENT_TYPES, { each: true }),
  );
const EVENTS_DOC = { enum: EVENT_TYPES, isArray: true, description: 'Event types to receive' };

export class CreateWebhookDto {
  @ApiProperty(URL_DOC)
  @TextLength(1, URL_MAX_LENGTH)
  url!: string;

  @ApiPropertyOptional({ ...EVENTS_DOC, description: 'Event types to receive; every type (present and future) when left out' })
  @EventsField()
  events?: EventType[];

  @ApiPropertyOptional({ maxLength: 255, description: 'Up to 255 characters for operators; no control characters, no bidi overrides' })
  @IsOmittable()
  @TextLength(0, 255)
  @Matches(DISPLAY_TEXT, { message: 'description must be text without control characters or direction overrides' })
  description?: string;
}

export class UpdateWebhookDto {
  @ApiPropertyOptional(URL_DOC)
  @IsOmittable()
  @TextLength(1, URL_MAX_LENGTH)
  url?: string;

  @ApiPropertyOptional(EVENTS_DOC)
  @EventsField()
  events?: EventType[];

  @ApiPropertyOptional({ description: 'false stops deliveries (pending ones wait); true resumes them and clears a disable after failures' })
  @IsOmittable()
  @IsBoolean()
  enabled?: boolean;
}

export class ListDeliveriesQuery extends PageQuery {
  @ApiPropertyOptional({ enum: DELIVERY_STATUSES })
  @IsOmittable()
  @IsIn(DELIVERY_STATUSES)
  status?: DeliveryStatus;
}

export class WebhookView {
  @ApiProperty({ example: '1' }) id!: string;
  @ApiProperty() url!: string;
  @ApiProperty(EVENTS_DOC) events!: EventType[];
  @ApiProperty({ nullable: true, type: String }) description!: string | null;
  @ApiProperty() enabled!: boolean;
  @ApiProperty({ nullable: true, type: String, description: 'Why the service disabled it (repeated failures), or null' })
  disabledReason!: string | null;
  @ApiProperty({ nullable: true, type: String, format: 'date-time' }) disabledAt!: string | null;
  @ApiProperty({ description: 'Deliveries in a row that failed every retry' }) failedInRow!: number;
  @ApiProperty({ format: 'date-time' }) createdAt!: string;
  @ApiProperty({ format: 'date-time' }) updatedAt!: string;
}

export class CreatedWebhookView extends WebhookView {
  @ApiProperty({ description: 'whsec_<base64>: the signing secret, shown only in this answer' })
  secret!: string;
}

export class AttemptView {
  @ApiProperty({ format: 'date-time' }) attemptedAt!: string;
  @ApiProperty({ nullable: true, type: Number, description: 'null when no answer came (timeout, refused connection)' })
  statusCode!: number | null;
  @ApiProperty({ nullable: true, type: String }) error!: string | null;
  @ApiProperty() durationMs!: number;
}

export class DeliveryView {
  @ApiProperty() id!: string;
  @ApiProperty({ example: 'evt_1024', description: 'The event id, also the webhook-id header' }) eventId!: string;
  @ApiProperty({ enum: EVENT_TYPES }) type!: EventType;
  @ApiProperty() userCouponId!: string;
  @ApiProperty({ enum: DELIVERY_STATUSES }) status!: DeliveryStatus;
  @ApiProperty({ description: 'Attempts made so far' }) attemptCount!: number;
  @ApiProperty({ nullable: true, type: Number }) lastStatusCode!: number | null;
  @ApiProperty({ nullable: true, type: String }) lastError!: string | null;
  @ApiProperty({ nullable: true, type: String, format: 'date-time', description: 'When the next attempt is due (PENDING only)' })
  nextAttemptAt!: string | null;
  @ApiProperty({
    nullable: true,
    type: String,
    description:
      'PENDING only: the earliest PENDING delivery of an earlier event of the same user coupon to this endpoint. Events of a coupon arrive in log order, so this one waits for that one, whenever it is due',
  })
  heldBackBy!: string | null;
  @ApiProperty({ format: 'date-time' }) createdAt!: string;
  @ApiProperty({ nullable: true, type: String, format: 'date-time' }) deliveredAt!: string | null;
  @ApiProperty({ type: [AttemptView], description: 'Every attempt, oldest first' }) attempts!: AttemptView[];
}

export class DeliveryPage {
  @ApiProperty({ type: [DeliveryView] }) items!: DeliveryView[];
  @ApiProperty({ nullable: true, type: String }) nextCursor!: string | null;
}

/** Most deliveries one redelivery request may name. */
export const REDELIVER_MAX_IDS = 100;

export class RedeliverDto {
  @ApiPropertyOptional({
    type: [String],
    minItems: 1,
    maxItems: REDELIVER_MAX_IDS,
    uniqueItems: true,
    items: { type: 'string', pattern: ID_PATTERN.source },
    description: 'Deliveries of this endpoint to send again, FAILED or DELIVERED; when left out (or with no body), every FAILED one',
  })
  @IsOmittable()
  @IsArray()
  @ArrayMinSize(1)
  @ArrayMaxSize(REDELIVER_MAX_IDS)
  @ArrayUnique()
  @IsString({ each: true })
  @Matches(ID_PATTERN, { each: true, message: 'each of deliveryIds must be a positive integer id' })
  deliveryIds?: string[];
}

export class RedeliveryView {
  @ApiProperty({ description: 'Deliveries made PENDING again, due now (those already PENDING are not counted)' })
  redelivered!: number;
}
