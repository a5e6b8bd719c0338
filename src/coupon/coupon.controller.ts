import { Body, Controller, Get, HttpCode, Param, Patch, Post } from '@nestjs/common';
import { ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import { Public, RequireRoles } from '../auth/principal.js';
import { IdPipe } from '../common/validation.js';
import { CreateCouponDto, PatchCouponDto, StockDeltaDto } from './coupon.dto.js';
import { CouponService, CouponView } from './coupon.service.js';

@ApiTags('coupons')
@Controller()
export class CouponController {
  constructor(private readonly coupons: CouponService) {}

  @Get('coupons/:couponId')
  @Public()
  view(@Param('couponId', IdPipe) id: string): Promise<CouponView> {
    return this.coupons.view(id);
  }
}

@ApiTags('admin')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/coupons')
export class AdminCouponController {
  constructor(private readonly coupons: CouponService) {}

  @Post()
  @HttpCode(201)
  create(@Body() dto: CreateCouponDto): Promise<CouponView> {
    return this.coupons.create(dto);
  }

  @Get(':couponId')
  async view(@Param('couponId', IdPipe) id: string) {
    const view = await this.coupons.view(id);
    return { ...view, counts: await this.coupons.counts(id) };
  }

  @Patch(':couponId')
  patch(@Param('couponId', IdPipe) id: string, @Body() dto: PatchCouponDto): Promise<CouponView> {
    return this.coupons.patch(id, dto);
  }

  @Post(':couponId/stock')
  @HttpCode(200)
  adjustStock(@Param('couponId', IdPipe) id: string, @Body() dto: StockDeltaDto): Promise<CouponView> {
    return this.coupons.adjustStock(id, dto.delta);
  }
}
