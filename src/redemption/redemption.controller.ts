import { Body, Controller, HttpCode, Post, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import type { FastifyReply } from 'fastify';
import { CurrentUser, type Principal, RequireRoles } from '../auth/principal.js';
import { RedeemDto, RefundDto } from './redemption.dto.js';
import { RedemptionService, RedemptionView, RefundView, toRedemptionView, toRefundView } from './redemption.service.js';

@ApiTags('redemptions')
@ApiBearerAuth()
@Controller('redemptions')
export class RedemptionController {
  constructor(private readonly redemptions: RedemptionService) {}

  /** 201 on first use; a repeat of the same (orderNo, userCouponId) answers 200 with firstUse: false and Idempotent-Replayed: true. */
  @Post()
  async redeem(
    @Body() dto: RedeemDto,
    @CurrentUser() principal: Principal,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<RedemptionView> {
    const { redemption, firstUse } = await this.redemptions.redeem(principal, dto);
    if (firstUse) void reply.status(201);
    else void reply.status(200).header('Idempotent-Replayed', 'true');
    return toRedemptionView(redemption, firstUse);
  }

  /** Repeats of a refundNo answer the same refund (201, Idempotent-Replayed: true). */
  @Post('refunds')
  @HttpCode(201)
  @RequireRoles('service')
  async refund(@Body() dto: RefundDto, @Res({ passthrough: true }) reply: FastifyReply): Promise<RefundView> {
    const { refund, replacement, replayed } = await this.redemptions.refund(dto);
    if (replayed) void reply.header('Idempotent-Replayed', 'true');
    return toRefundView(refund, replacement);
  }
}
