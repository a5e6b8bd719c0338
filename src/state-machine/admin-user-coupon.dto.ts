import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { IsBoolean } from 'class-validator';
import { IsId, IsOmittable, IsUserId, ReasonText, USER_ID_PATTERN } from '../common/validation.js';

export class VoidUserCouponDto {
  @ApiProperty({ minLength: 1, maxLength: 255, description: 'Why the coupon is voided; written to the state log' })
  @ReasonText(255)
  reason!: string;
}

export class ReissueUserCouponDto {
  @ApiProperty({ example: '1024', description: 'The coupon template to issue from' })
  @IsId()
  couponId!: string;

  @ApiProperty({ pattern: USER_ID_PATTERN.source })
  @IsUserId()
  userId!: string;

  @ApiProperty({ minLength: 1, maxLength: 255 })
  @ReasonText(255)
  reason!: string;

  @ApiProperty({ description: 'true: takes one unit of the coupon stock (409 SOLD_OUT when none is left); false: stock-neutral' })
  @IsBoolean()
  fromStock!: boolean;

  @ApiPropertyOptional({
    example: '2048',
    description: "The user's coupon this one replaces (must belong to the same user); it is not voided by the reissue",
  })
  @IsOmittable()
  @IsId()
  replacesUserCouponId?: string;
}
