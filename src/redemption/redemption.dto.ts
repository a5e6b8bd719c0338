import { ApiProperty, ApiPropertyOptional, PickType } from '@nestjs/swagger';
import { IsInt, IsString, Matches, Max, Min } from 'class-validator';
import { ActingForUserId, IsId, IsOmittable, MAX_CENTS, TextLength } from '../common/validation.js';

/** Printable and not only spaces: order and refund numbers are kept as sent, spaces included, but a blank one names nothing. */
const PRINTABLE = /^(?!\s*$)[^\p{C}]+$/u;

export class RedeemDto {
  @ApiProperty({ example: '1024' })
  @IsId('userCouponId must be an id')
  userCouponId!: string;

  @ApiProperty({ minLength: 1, maxLength: 64 })
  @IsString()
  @TextLength(1, 64)
  @Matches(PRINTABLE, { message: 'orderNo must be printable and not only spaces' })
  orderNo!: string;

  @ApiProperty({ minimum: 0 })
  @IsInt()
  @Min(0)
  @Max(MAX_CENTS)
  orderAmountCents!: number;

  @ActingForUserId()
  userId?: string;
}

export class HoldDto extends RedeemDto {
  @ApiPropertyOptional({ minimum: 1, maximum: 86_400, description: 'How long the hold lasts; default HOLD_TTL_SECONDS (900)' })
  @IsOmittable()
  @IsInt()
  @Min(1)
  @Max(86_400)
  ttlSeconds?: number;
}

export class ReleaseHoldDto extends PickType(RedeemDto, ['userCouponId', 'orderNo', 'userId'] as const) {}

export class RefundDto {
  @ApiProperty({ example: '1024' })
  @IsId('userCouponId must be an id')
  userCouponId!: string;

  @ApiProperty()
  @IsString()
  @TextLength(1, 64)
  @Matches(PRINTABLE, { message: 'orderNo must be printable and not only spaces' })
  orderNo!: string;

  @ApiProperty()
  @IsString()
  @TextLength(1, 64)
  @Matches(PRINTABLE, { message: 'refundNo must be printable and not only spaces' })
  refundNo!: string;
}
