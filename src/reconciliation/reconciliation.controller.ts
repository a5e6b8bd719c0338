import { Body, Controller, Get, HttpCode, Param, Post, Query } from '@nestjs/common';
import { ApiBearerAuth, ApiBody, ApiTags } from '@nestjs/swagger';
import { CurrentUser, RequireRoles } from '../auth/principal.js';
import type { Principal } from '../auth/principal.js';
import { IdPipe, OptionalBodyPipe } from '../common/validation.js';
import type { RunMode } from './reconciliation-run.entity.js';
import { PageQuery, DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { StartRunDto } from './reconciliation.dto.js';
import { ReconciliationService } from './reconciliation.service.js';

interface StartRunBody {
  mode?: RunMode;
}

@ApiTags('reconciliation')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/reconciliation/runs')
export class ReconciliationController {
  constructor(private readonly reconciliation: ReconciliationService) {}

  @Post()
  @HttpCode(202)
  @ApiBody({ type: StartRunDto, required: false })
  async start(@CurrentUser() admin: Principal, @Body(new OptionalBodyPipe(StartRunDto)) body: StartRunBody): Promise<{ runId: string }> {
    const { runId } = await this.reconciliation.start(body.mode ?? 'FULL', admin.userId);
    return { runId };
  }

  @Get()
  list(@Query() query: PageQuery) {
    return this.reconciliation.list(query.limit ?? DEFAULT_PAGE_LIMIT, query.cursor);
  }

  @Get(':runId')
  get(@Param('runId', IdPipe) runId: string) {
    return this.reconciliation.get(runId);
  }
}
