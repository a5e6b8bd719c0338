import { Body, Controller, Get, HttpCode, Param, Post, Query } from '@nestjs/common';
import { ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import { CurrentUser, RequireRoles } from '../auth/principal.js';
import type { Principal } from '../auth/principal.js';
import { IdPipe } from '../common/validation.js';
import { DEFAULT_PAGE_LIMIT } from '../common/page.js';
import { CompensationService } from './compensation.service.js';
import { DecisionDto, ListCompensationsQuery } from './reconciliation.dto.js';

@ApiTags('reconciliation')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/compensations')
export class CompensationController {
  constructor(private readonly compensations: CompensationService) {}

  @Get()
  list(@Query() query: ListCompensationsQuery) {
    return this.compensations.list({ status: query.status, runId: query.runId }, query.limit ?? DEFAULT_PAGE_LIMIT, query.cursor);
  }

  @Post(':id/approve')
  @HttpCode(200)
  approve(@Param('id', IdPipe) id: string, @Body() body: DecisionDto, @CurrentUser() admin: Principal) {
    return this.compensations.decide(id, true, admin.userId, body.reason);
  }

  @Post(':id/reject')
  @HttpCode(200)
  reject(@Param('id', IdPipe) id: string, @Body() body: DecisionDto, @CurrentUser() admin: Principal) {
    return this.compensations.decide(id, false, admin.userId, body.reason);
  }
}
