import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { IsIn } from 'class-validator';
import { IsId, IsOmittable, ReasonText } from '../common/validation.js';
import { PageQuery } from '../common/page.js';
import { COMPENSATION_STATUSES } from './compensation.entity.js';
import type { CompensationStatus } from './compensation.entity.js';
import { RUN_MODES } from './reconciliation-run.entity.js';
import type { RunMode } from './reconciliation-run.entity.js';

export class StartRunDto {
  @ApiPropertyOptional({
    enum: RUN_MODES,
    default: 'FULL',
    description: 'INCREMENTAL replays the state log only for coupons changed since the last complete run',
  })
  @IsOmittable()
  @IsIn(RUN_MODES)
  mode?: RunMode;
}

export class ListCompensationsQuery extends PageQuery {
  @ApiPropertyOptional({ enum: COMPENSATION_STATUSES })
  @IsOmittable()
  @IsIn(COMPENSATION_STATUSES)
  status?: CompensationStatus;

  @ApiPropertyOptional({ description: 'only the compensations proposed by this run' })
  @IsOmittable()
  @IsId()
  runId?: string;
}

export class DecisionDto {
  @ApiProperty({ minLength: 1, maxLength: 500 })
  @ReasonText(500)
  reason!: string;
}
