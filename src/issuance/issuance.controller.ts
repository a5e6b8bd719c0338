import { Controller, Get, Headers, HttpCode, Param, Post, Query, Req, Res, StreamableFile } from '@nestjs/common';
import { ApiAcceptedResponse, ApiBody, ApiConsumes, ApiHeader, ApiOkResponse, ApiTags, ApiBearerAuth } from '@nestjs/swagger';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Readable } from 'node:stream';
import { CurrentUser, RequireRoles } from '../auth/principal.js';
import type { Principal } from '../auth/principal.js';
import { checkIdempotencyKey, IdPipe, StrictValidationPipe, validationFailed } from '../common/validation.js';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import {
  CsvIssuanceQuery,
  IssuanceJobPage,
  IssuanceJobView,
  JobCreatedView,
  JobListQuery,
  JsonIssuanceDto,
  SkippedCsvQuery,
  SkippedPage,
  SkippedQuery,
} from './issuance.dto.js';
import { IssuanceService } from './issuance.service.js';
import { isCsv } from './upload.js';
import { csvDecoder, csvHeader, userIdLines } from './user-id-lines.js';

async function* jsonLines(userIds: readonly string[]) {
  for (let i = 0; i < userIds.length; i++) yield { lineNo: i + 1, text: userIds[i] };
}

@ApiTags('admin')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin')
export class IssuanceController {
  private readonly pipe = new StrictValidationPipe();

  constructor(private readonly issuance: IssuanceService) {}

  /**
   * A JSON list (up to 10,000 ids) or a text/csv upload (up to 1,000,000 lines, 64 MiB) streamed
   * into the database as it arrives; its settings are then query parameters.
   */
  @Post('coupons/:couponId/issuances')
  @HttpCode(202)
  @ApiConsumes('application/json', 'text/csv')
  @ApiBody({ type: JsonIssuanceDto })
  @ApiHeader({ name: 'Idempotency-Key', required: true, description: '1-128 of [A-Za-z0-9_-]; a repeat answers the same job' })
  @ApiAcceptedResponse({ type: JobCreatedView })
  async create(
    @Param('couponId', IdPipe) couponId: string,
    @Headers('idempotency-key') rawKey: string | undefined,
    @Query() query: CsvIssuanceQuery,
    @Req() req: FastifyRequest,
    @CurrentUser() admin: Principal,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<JobCreatedView> {
    const key = checkIdempotencyKey(rawKey, 'Idempotency-Key');
    let request: { reason: string; fromStock: boolean };
    let lines: AsyncIterable<{ lineNo: number; text: string }>;
    if (isCsv(req)) {
      const missing = Object.fromEntries(
        (['reason', 'fromStock'] as const).filter((f) => query[f] === undefined).map((f) => [f, ['required with a text/csv body']]),
      );
      if (Object.keys(missing).length > 0) throw validationFailed(missing);
      request = { reason: query.reason as string, fromStock: query.fromStock as boolean };
      const type = req.headers['content-type'];
      lines = userIdLines(req.body as Readable, csvDecoder(type), csvHeader(type), this.issuance.stopping);
    } else {
      const fields = Object.keys(query).filter((f) => query[f as keyof CsvIssuanceQuery] !== undefined);
      if (fields.length > 0)
        throw validationFailed(Object.fromEntries(fields.map((f) => [f, ['only with a text/csv body; put it in the JSON body']])));
      const dto = (await this.pipe.transform(req.body, { type: 'body', metatype: JsonIssuanceDto, data: '' })) as JsonIssuanceDto;
      request = dto;
      lines = jsonLines(dto.userIds);
    }
    const { jobId, replayed } = await this.issuance.create({ couponId, key, createdBy: admin.userId, ...request }, lines);
    if (replayed) void reply.header('Idempotent-Replayed', 'true');
    return { jobId };
  }

  @Get('issuance-jobs')
  @ApiOkResponse({ type: IssuanceJobPage })
  list(@Query() q: JobListQuery): Promise<IssuanceJobPage> {
    return this.issuance.list(q.couponId, q.cursor, q.limit ?? DEFAULT_PAGE_LIMIT);
  }

  @Get('issuance-jobs/:jobId')
  @ApiOkResponse({ type: IssuanceJobView })
  get(@Param('jobId', IdPipe) jobId: string): Promise<IssuanceJobView> {
    return this.issuance.get(jobId);
  }

  @Get('issuance-jobs/:jobId/skipped')
  @ApiOkResponse({ type: SkippedPage })
  skipped(@Param('jobId', IdPipe) jobId: string, @Query() q: SkippedQuery): Promise<SkippedPage> {
    return this.issuance.skipped(jobId, q.reason, Number(q.cursor ?? 0), q.limit ?? DEFAULT_PAGE_LIMIT);
  }

  /** One user id per line, as the issuance route takes a text/csv list: the SOLD_OUT lines go back up as a new job. */
  @Get('issuance-jobs/:jobId/skipped.csv')
  async skippedCsv(@Param('jobId', IdPipe) jobId: string, @Query() q: SkippedCsvQuery): Promise<StreamableFile> {
    const csv = await this.issuance.skippedCsv(jobId, q.reason);
    return new StreamableFile(csv, {
      type: 'text/csv; charset=utf-8',
      disposition: `attachment; filename="job-${jobId}-skipped${q.reason ? `-${q.reason}` : ''}.csv"`,
    });
  }

  /** The users of the lines a cancelled or failed job did not reach, as the issuance route takes a text/csv list: the rest goes up as a new job. */
  @Get('issuance-jobs/:jobId/unprocessed.csv')
  async unprocessedCsv(@Param('jobId', IdPipe) jobId: string): Promise<StreamableFile> {
    const csv = await this.issuance.unprocessedCsv(jobId);
    return new StreamableFile(csv, { type: 'text/csv; charset=utf-8', disposition: `attachment; filename="job-${jobId}-unprocessed.csv"` });
  }

  @Post('issuance-jobs/:jobId/cancel')
  @HttpCode(200)
  @ApiOkResponse({ type: IssuanceJobView })
  cancel(@Param('jobId', IdPipe) jobId: string): Promise<IssuanceJobView> {
    return this.issuance.cancel(jobId);
  }
}
