import { Body, Controller, Get, Header, Headers, HttpCode, Param, Patch, Post, Query, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiHeader, ApiNotFoundResponse, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import type { FastifyReply } from 'fastify';
import { Public, RequireRoles } from '../auth/principal.js';
import { checkIdempotencyKey, IdPipe } from '../common/validation.js';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import {
  AdminCouponsQuery,
  CouponSeriesView,
  CreateCouponDto,
  PatchCouponDto,
  PublicCouponsQuery,
  SeriesQuery,
  StockDeltaDto,
} from './coupon.dto.js';
import { CouponService, CouponView } from './coupon.service.js';
import { GrabSeries, SERIES_SECONDS } from './grab-series.js';
import { JSON_TYPE } from '../common/http-exception.filter.js';

const OPTIONAL_KEY = {
  name: 'Idempotency-Key',
  required: false,
  description:
    '1-128 of [A-Za-z0-9_-]: a repeat of the request answers the coupon it changed, as it is now (Idempotent-Replayed: true), instead of applying it again; the key with another request is 422',
};
const optionalKey = (key: string | undefined) => (key === undefined ? undefined : checkIdempotencyKey(key, 'Idempotency-Key'));
function replayed(reply: FastifyReply, answer: { coupon: CouponView; replayed: boolean }): CouponView {
  if (answer.replayed) void reply.header('Idempotent-Replayed', 'true');
  return answer.coupon;
}

@ApiTags('coupons')
@Controller()
export class CouponController {
  constructor(private readonly coupons: CouponService) {}

  /**
   * Live coupons (not paused, grab window not ended), soonest grab start first; served from memory,
   * already serialised, and gzip'd once for the clients that accept it. The reply, not @Req(): a
   * handler that takes the request is taken to read a body (UndeclaredInputGuard). This route and the
   * next are the fallback: when memory holds the answer, public-reads.ts sends it before they run.
   */
  @Get('coupons')
  @Public()
  @Header('Content-Type', JSON_TYPE)
  async list(@Query() q: PublicCouponsQuery, @Res({ passthrough: true }) reply: FastifyReply): Promise<Buffer> {
    return (await this.coupons.liveCouponsJson(q.limit ?? DEFAULT_PAGE_LIMIT, q.cursor)).body(reply);
  }

  @Get('coupons/:couponId')
  @Public()
  @Header('Content-Type', JSON_TYPE)
  async view(@Param('couponId', IdPipe) id: string, @Res({ passthrough: true }) reply: FastifyReply): Promise<Buffer> {
    return (await this.coupons.publicViewJson(id)).body(reply);
  }
}

@ApiTags('admin')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/coupons')
export class AdminCouponController {
  constructor(
    private readonly coupons: CouponService,
    private readonly series: GrabSeries,
  ) {}

  @Get()
  @ApiOperation({
    summary:
      'Coupons, newest first, each with its counts by status (counted at each request, in one snapshot with the stock: for lists, not for polling)',
  })
  @ApiOkResponse({
    description: 'A page of coupons',
    schema: {
      properties: {
        items: { type: 'array', items: { type: 'object', description: 'Coupon with counts, as GET /admin/coupons/:couponId answers' } },
        nextCursor: { type: 'string', nullable: true, description: 'Pass as cursor for the next page; null on the last' },
      },
    },
  })
  list(@Query() query: AdminCouponsQuery) {
    return this.coupons.list(query.limit ?? DEFAULT_PAGE_LIMIT, query.cursor, query.q);
  }

  @Get(':couponId/series')
  @ApiOperation({
    summary:
      'Live view for polling: remaining stock (one primary-key read) and grab outcomes per second over the last seconds, counted in this instance’s memory',
  })
  @ApiOkResponse({ type: CouponSeriesView })
  @ApiNotFoundResponse({ description: 'COUPON_NOT_FOUND' })
  async liveSeries(@Param('couponId', IdPipe) id: string, @Query() query: SeriesQuery): Promise<CouponSeriesView> {
    const live = await this.coupons.live(id);
    const window = this.series.read(id, query.seconds ?? SERIES_SECONDS);
    return { couponId: id, ...live, ...window, from: new Date(window.from * 1000).toISOString() };
  }

  @Post()
  @HttpCode(201)
  @ApiHeader(OPTIONAL_KEY)
  async create(
    @Body() dto: CreateCouponDto,
    @Headers('idempotency-key') key: string | undefined,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<CouponView> {
    return replayed(reply, await this.coupons.create(dto, optionalKey(key)));
  }

  @Get(':couponId')
  view(@Param('couponId', IdPipe) id: string) {
    return this.coupons.viewWithCounts(id);
  }

  @Patch(':couponId')
  patch(@Param('couponId', IdPipe) id: string, @Body() dto: PatchCouponDto): Promise<CouponView> {
    return this.coupons.patch(id, dto);
  }

  @Post(':couponId/stock')
  @HttpCode(200)
  @ApiHeader(OPTIONAL_KEY)
  async adjustStock(
    @Param('couponId', IdPipe) id: string,
    @Body() dto: StockDeltaDto,
    @Headers('idempotency-key') key: string | undefined,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<CouponView> {
    return replayed(reply, await this.coupons.adjustStock(id, dto.delta, optionalKey(key)));
  }
}
