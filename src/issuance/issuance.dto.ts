import { applyDecorators } from '@nestjs/common';
import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { Transform } from 'class-transformer';
import { ArrayMaxSize, ArrayMinSize, IsArray, IsBoolean, IsIn, IsString } from 'class-validator';
import { IsId, IsOmittable, ReasonText } from '../common/validation.js';
import { PageQuery } from '../common/page.js';
import { JOB_STATUSES, SKIP_REASONS } from './issuance.store.js';
import type { SkipReason } from './issuance.store.js';

export const JSON_MAX_USER_IDS = 10_000;

/** A JSON job: the list itself, with why and whether it takes stock. */
export class JsonIssuanceDto {
  @ApiProperty({
    type: [String],
    minItems: 1,
    maxItems: JSON_MAX_USER_IDS,
    description: 'User ids; ones that are not 1-64 of [A-Za-z0-9_.:-] are skipped as INVALID_USER_ID, repeats as DUPLICATE',
    example: ['alice', 'bob'],
  })
  @IsArray()
  @ArrayMinSize(1)
  @ArrayMaxSize(JSON_MAX_USER_IDS)
  @IsString({ each: true })
  userIds!: string[];

  @ApiProperty({ minLength: 1, maxLength: 255, example: 'VIP November' })
  @ReasonText(255)
  reason!: string;

  @ApiProperty({ description: 'Take each coupon from the stock (lines past the stock are skipped as SOLD_OUT)' })
  @IsBoolean()
  fromStock!: boolean;
}

const toBool = ({ value }: { value: unknown }) => (value === 'true' ? true : value === 'false' ? false : value);

/** A `text/csv` job's settings, as query parameters (the body is the list). */
export class CsvIssuanceQuery {
  @ApiPropertyOptional({
    minLength: 1,
    maxLength: 255,
    description: 'Required with a text/csv body; 400 with a JSON body (it goes in the body)',
  })
  @IsOmittable()
  @ReasonText(255)
  reason?: string;

  @ApiPropertyOptional({
    enum: ['true', 'false'],
    description: 'Required with a text/csv body; 400 with a JSON body (it goes in the body)',
  })
  @IsOmittable()
  @Transform(toBool)
  @IsBoolean()
  fromStock?: boolean;
}

const ReasonFilter = () =>
  applyDecorators(
    ApiPropertyOptional({ enum: SKIP_REASONS, description: 'Only the lines skipped for this reason' }),
    IsOmittable(),
    IsIn(SKIP_REASONS),
  );

export class SkippedQuery extends PageQuery {
  @ReasonFilter()
  reason?: SkipReason;
}

/** The CSV of a job's skipped lines is all of them (of one reason when given): no page. */
export class SkippedCsvQuery {
  @ReasonFilter()
  reason?: SkipReason;
}

export class JobListQuery extends PageQuery {
  @ApiPropertyOptional({ description: "Only this coupon's jobs", example: '1' })
  @IsOmittable()
  @IsId()
  couponId?: string;
}

export class JobCreatedView {
  @ApiProperty({ example: '1' }) jobId!: string;
}

export class SkippedByReasonView {
  @ApiProperty({ type: 'integer' }) USER_LIMIT_REACHED!: number;
  @ApiProperty({ type: 'integer' }) SOLD_OUT!: number;
  @ApiProperty({ type: 'integer' }) INVALID_USER_ID!: number;
  @ApiProperty({ type: 'integer' }) DUPLICATE!: number;
  @ApiProperty({ type: 'integer', description: "Lines reached after the coupon's fixed validity ended" }) COUPON_EXPIRED!: number;
}

export class IssuanceJobView {
  @ApiProperty({ example: '1' }) id!: string;
  @ApiProperty({ example: '1' }) couponId!: string;
  @ApiProperty({ enum: JOB_STATUSES }) status!: (typeof JOB_STATUSES)[number];
  @ApiProperty() reason!: string;
  @ApiProperty() fromStock!: boolean;
  @ApiProperty({ type: 'integer', description: 'User ids in the list (blank lines and a header line not counted)' }) total!: number;
  @ApiProperty({ type: 'integer' }) issued!: number;
  @ApiProperty({ type: 'integer' }) skipped!: number;
  @ApiProperty({ type: SkippedByReasonView }) skippedByReason!: SkippedByReasonView;
  @ApiProperty({ format: 'date-time' }) createdAt!: string;
  @ApiProperty({ nullable: true, type: String, format: 'date-time' }) startedAt!: string | null;
  @ApiProperty({ nullable: true, type: String, format: 'date-time' }) finishedAt!: string | null;
}

export class IssuanceJobPage {
  @ApiProperty({ type: [IssuanceJobView] }) items!: IssuanceJobView[];
  @ApiProperty({ nullable: true, type: String }) nextCursor!: string | null;
}

export class SkippedLineView {
  @ApiProperty({ type: 'integer', description: 'Line number in the uploaded file (CSV), or position in userIds (JSON), from 1' })
  line!: number;
  @ApiProperty({ description: 'The line as given (at most 64 characters of it)' }) userId!: string;
  @ApiProperty({ enum: SKIP_REASONS }) reason!: SkipReason;
}

export class SkippedPage {
  @ApiProperty({ type: [SkippedLineView] }) items!: SkippedLineView[];
  @ApiProperty({ nullable: true, type: String }) nextCursor!: string | null;
}
