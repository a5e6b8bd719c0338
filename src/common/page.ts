import { ApiPropertyOptional } from '@nestjs/swagger';
import { IsInt, Max, Min } from 'class-validator';
import { IsId, IsOmittable, QueryInt } from './validation.js';

export interface Page<V> {
  items: V[];
  nextCursor: string | null;
}

/**
 * A cursor page from rows read with a limit of `limit + 1`: the extra row only says that another
 * page follows, and the cursor is the id of the last row listed.
 */
export function toPage<R extends { id: string }, V>(rows: readonly R[], limit: number, view: (row: R) => V): Page<V> {
  const page = rows.slice(0, limit);
  return { items: page.map(view), nextCursor: rows.length > limit ? page[page.length - 1].id : null };
}

/** A list's page size when the query names none. */
export const DEFAULT_PAGE_LIMIT = 20;

/** `limit` (1-100, default DEFAULT_PAGE_LIMIT) of a cursor-paginated list; each list's cursor has its own form. */
export class PageLimitQuery {
  @ApiPropertyOptional({ minimum: 1, maximum: 100, default: DEFAULT_PAGE_LIMIT })
  @IsOmittable()
  @QueryInt()
  @IsInt()
  @Min(1)
  @Max(100)
  limit?: number;
}

/** `limit` and `cursor` (a previous page's nextCursor, an id) of a cursor-paginated list. */
export class PageQuery extends PageLimitQuery {
  @ApiPropertyOptional({ description: 'nextCursor of the previous page' })
  @IsOmittable()
  @IsId()
  cursor?: string;
}
