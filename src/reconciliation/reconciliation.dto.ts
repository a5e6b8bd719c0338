import { Injectable } from '@nestjs/common';
import type { ArgumentMetadata, PipeTransform, Type as ClassType } from '@nestjs/common';
import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { IsIn, IsString } from 'class-validator';
import { IsId, IsOmittable, StrictValidationPipe, TextLength } from '../common/validation.js';
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
  @IsString()
  @TextLength(1, 500)
  reason!: string;
}

/**
 * A body that may be absent: a POST with no body gets the DTO's defaults, anything sent is
 * validated as strictly as every other body, so a JSON `null` is 400 `body` as on any other route
 * (it is a body, not the absence of one). (The global pipe requires a body for DTO-typed
 * parameters, so the handler types its parameter with an interface and lets this pipe do the work.)
 */
@Injectable()
export class OptionalBodyPipe<T extends object> implements PipeTransform<unknown, Promise<T>> {
  private readonly strict = new StrictValidationPipe();

  constructor(private readonly dto: ClassType<T>) {}

  async transform(value: unknown, metadata: ArgumentMetadata): Promise<T> {
    if (value === undefined) return new this.dto();
    return (await this.strict.transform(value, { ...metadata, metatype: this.dto })) as T;
  }
}
