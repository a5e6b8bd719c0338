import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { Transform, Type } from 'class-transformer';
import {
  IsBoolean,
  IsIn,
  IsInt,
  IsNotEmptyObject,
  IsOptional,
  IsString,
  Matches,
  Max,
  Min,
  NotEquals,
  ValidateIf,
  ValidateNested,
} from 'class-validator';
import { USER_COUPON_STATUSES } from '../ledger/transitions.js';
import {
  ActingForUserId,
  DISPLAY_NAME,
  ID_PATTERN,
  IsId,
  IsInstant,
  IsOmittable,
  IsUserId,
  MAX_CENTS,
  QueryInt,
  SharedQuery,
  TextLength,
} from '../common/validation.js';
import { SERIES_SECONDS } from './grab-series.js';
import { PageLimitQuery, PageQuery } from '../common/page.js';

/** What the service takes as a time: the validators' rules and the service's range, for the document. */
const INSTANT_TEXT = 'ISO 8601 with its zone (Z or ±hh:mm), from the year 2000 to 9998';

/** A position in the public list: grab start (ms since the epoch) and id of the last coupon shown. */
export const PUBLIC_CURSOR = new RegExp(`^[0-9]{1,15}_${ID_PATTERN.source.slice(1)}`);

export class ValidityDto {
  @ApiProperty({ enum: ['FIXED', 'RELATIVE'] })
  @IsIn(['FIXED', 'RELATIVE'])
  type!: 'FIXED' | 'RELATIVE';

  @ApiPropertyOptional({ description: `FIXED only (required there): ${INSTANT_TEXT}` })
  @ValidateIf((o: ValidityDto) => o.type === 'FIXED' || o.startAt !== undefined)
  @IsInstant()
  startAt?: string;

  @ApiPropertyOptional({ description: `FIXED only (required there): ${INSTANT_TEXT}; after startAt and grabStartAt` })
  @ValidateIf((o: ValidityDto) => o.type === 'FIXED' || o.endAt !== undefined)
  @IsInstant()
  endAt?: string;

  @ApiPropertyOptional({ description: 'RELATIVE only (required there): days from issuance', minimum: 1, maximum: 3650 })
  @ValidateIf((o: ValidityDto) => o.type === 'RELATIVE' || o.days !== undefined)
  @IsInt()
  @Min(1)
  @Max(3650)
  days?: number;
}

export class DiscountDto {
  @ApiPropertyOptional({ enum: ['AMOUNT', 'PERCENT'], description: 'AMOUNT when left out' })
  @IsOmittable()
  @IsIn(['AMOUNT', 'PERCENT'])
  type?: 'AMOUNT' | 'PERCENT';

  @ApiProperty({ minimum: 0 })
  @IsInt()
  @Min(0)
  @Max(MAX_CENTS)
  thresholdCents!: number;

  @ApiPropertyOptional({ minimum: 1, description: 'AMOUNT only (required there): the amount off' })
  @ValidateIf((o: DiscountDto) => o.type !== 'PERCENT' || o.amountCents !== undefined)
  @IsInt()
  @Min(1)
  @Max(MAX_CENTS)
  amountCents?: number;

  @ApiPropertyOptional({ minimum: 1, maximum: 100, description: 'PERCENT only (required there)' })
  @ValidateIf((o: DiscountDto) => o.type === 'PERCENT' || o.percentOff !== undefined)
  @IsInt()
  @Min(1)
  @Max(100)
  percentOff?: number;

  @ApiPropertyOptional({ minimum: 1, nullable: true, description: 'PERCENT only: the most it takes off; null or left out: no cap' })
  // null as a coupon answers it ("no cap"), so a discount read back can be sent again; the same as leaving it out.
  @Transform(({ value }: { value: unknown }) => (value === null ? undefined : value))
  @IsOmittable()
  @IsInt()
  @Min(1)
  @Max(MAX_CENTS)
  maxDiscountCents?: number;
}

export class CreateCouponDto {
  @ApiProperty({
    minLength: 1,
    maxLength: 200,
    description: '1-200 characters shown to shoppers: some visible text, no control characters, no bidi overrides',
  })
  @IsString()
  @TextLength(1, 200)
  @Matches(DISPLAY_NAME, { message: 'name must be visible text without control characters or direction overrides' })
  name!: string;

  @ApiProperty({ minimum: 0, maximum: 1e9 })
  @IsInt()
  @Min(0)
  @Max(1_000_000_000)
  totalStock!: number;

  @ApiPropertyOptional({ default: 1, minimum: 1 })
  @IsOmittable()
  @IsInt()
  @Min(1)
  @Max(1_000_000)
  perUserLimit?: number;

  @ApiProperty({ description: INSTANT_TEXT })
  @IsInstant()
  grabStartAt!: string;

  @ApiProperty({ description: `${INSTANT_TEXT}; after grabStartAt` })
  @IsInstant()
  grabEndAt!: string;

  @ApiProperty({ type: ValidityDto })
  @IsNotEmptyObject()
  @ValidateNested()
  @Type(() => ValidityDto)
  validity!: ValidityDto;

  @ApiProperty({ type: DiscountDto })
  @IsNotEmptyObject()
  @ValidateNested()
  @Type(() => DiscountDto)
  discount!: DiscountDto;

  @ApiPropertyOptional({ description: 'Per-instance grab admissions per second; default RATE_LIMIT_PER_SECOND' })
  @IsOmittable()
  @IsInt()
  @Min(1)
  @Max(1_000_000)
  rateLimitPerSecond?: number;

  @ApiPropertyOptional({ default: false })
  @IsOmittable()
  @IsBoolean()
  returnOnRefund?: boolean;

  @ApiPropertyOptional({ default: false, description: 'May share an order with other coupons, when all of them are stackable' })
  @IsOmittable()
  @IsBoolean()
  stackable?: boolean;
}

export class PatchCouponDto {
  @ApiPropertyOptional({ enum: ['ACTIVE', 'PAUSED'] })
  @IsOmittable()
  @IsIn(['ACTIVE', 'PAUSED'])
  status?: 'ACTIVE' | 'PAUSED';

  @ApiPropertyOptional({ nullable: true, description: 'null resets to the default' })
  @IsOptional()
  @IsInt()
  @Min(1)
  @Max(1_000_000)
  rateLimitPerSecond?: number | null;
}

export class StockDeltaDto {
  @ApiProperty({ description: 'Non-zero: positive adds stock, negative removes it' })
  @IsInt()
  @NotEquals(0, { message: 'delta must not be 0' })
  @Min(-1_000_000_000)
  @Max(1_000_000_000)
  delta!: number;
}

export class MyCouponsQuery extends PageLimitQuery {
  @ApiPropertyOptional({ enum: USER_COUPON_STATUSES })
  @IsOmittable()
  @IsIn(USER_COUPON_STATUSES)
  status?: (typeof USER_COUPON_STATUSES)[number];

  @ApiPropertyOptional({ description: 'nextCursor of the previous page' })
  @IsOmittable()
  @IsId('cursor must be a nextCursor value')
  cursor?: string;
}

/** GET /admin/user-coupons: the user named in the query, where any user id can go (see the route's description). */
export class AdminUserCouponsQuery extends MyCouponsQuery {
  @ApiProperty({ description: 'The user whose coupons to list' })
  @IsUserId()
  userId!: string;
}

export class SeriesQuery {
  @ApiPropertyOptional({ minimum: 10, maximum: SERIES_SECONDS, default: SERIES_SECONDS })
  @IsOmittable()
  @QueryInt()
  @IsInt()
  @Min(10)
  @Max(SERIES_SECONDS)
  seconds?: number;
}

export class CouponSeriesView {
  @ApiProperty()
  couponId!: string;

  @ApiProperty({ enum: ['ACTIVE', 'PAUSED'] })
  status!: 'ACTIVE' | 'PAUSED';

  @ApiProperty()
  initStock!: number;

  @ApiProperty()
  remainingStock!: number;

  @ApiProperty({ description: 'ISO 8601 UTC of the first second; point i is that second plus i' })
  from!: string;

  @ApiProperty({ description: 'Points per outcome' })
  seconds!: number;

  @ApiProperty({
    description:
      'Outcome (ISSUED, REPLAYED, or the error code: SOLD_OUT, USER_LIMIT_REACHED, RATE_LIMITED, ...) -> grabs answered per second; outcomes with no grab in the window are absent',
    additionalProperties: { type: 'array', items: { type: 'integer' } },
    example: { ISSUED: [0, 12, 40], SOLD_OUT: [0, 0, 7] },
  })
  outcomes!: Record<string, number[]>;
}

export class UsableCouponsQuery {
  @ApiProperty({ minimum: 0, description: 'The order amount the coupons are for' })
  @QueryInt()
  @IsInt()
  @Min(0)
  @Max(MAX_CENTS)
  orderAmountCents!: number;

  @ActingForUserId()
  userId?: string;
}

export class AdminCouponsQuery extends PageQuery {
  @ApiPropertyOptional({
    minLength: 1,
    maxLength: 200,
    description: 'Only coupons whose name holds this text (any case), or whose id it is',
    example: '双11',
  })
  @IsOmittable()
  @IsString()
  @TextLength(1, 200)
  @Matches(DISPLAY_NAME, { message: 'q must be visible text without control characters or direction overrides' })
  q?: string;
}

@SharedQuery()
export class PublicCouponsQuery extends PageLimitQuery {
  @ApiPropertyOptional({ description: 'nextCursor of the previous page' })
  @IsOmittable()
  @Matches(PUBLIC_CURSOR, { message: 'cursor must be a nextCursor value' })
  cursor?: string;
}
