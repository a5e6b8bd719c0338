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
