import { Body, Controller, HttpCode, Post, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import type { FastifyReply } from 'fastify';
import { CurrentUser, type Principal } from '../auth/principal.js';
import { HoldView, toHoldView } from './hold.entity.js';
import { HoldService } from './hold.service.js';
import { HoldDto, ReleaseHoldDto } from './redemption.dto.js';

@ApiTags('redemptions')
@ApiBearerAuth()
@Controller('redemptions/holds')
export class HoldController {
  constructor(private readonly holds: HoldService) {}

  /** 201 for a new hold; a repeat of the same (orderNo, userCouponId) answers that hold as it is now (200, Idempotent-Replayed). */
  @Post()
  async hold(
    @Body() dto: HoldDto,
    @CurrentUser() principal: Principal,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<HoldView> {
    const { hold, replayed } = await this.holds.hold(principal, dto);
    void reply.status(replayed ? 200 : 201);
    if (replayed) void reply.header('Idempotent-Replayed', 'true');
    return toHoldView(hold);
  }

  /** Repeats answer the same hold (200, Idempotent-Replayed). */
  @Post('release')
  @HttpCode(200)
  async release(
    @Body() dto: ReleaseHoldDto,
    @CurrentUser() principal: Principal,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<HoldView> {
    const { hold, replayed } = await this.holds.release(principal, dto);
    if (replayed) void reply.header('Idempotent-Replayed', 'true');
    return toHoldView(hold);
  }
}
