import { parse } from 'fast-querystring';

/** Set on a parsed query whose text has a %-escape that is broken (`%G0`, a lone `%`) or not UTF-8 (`%FF`, `%C3`). */
export const MALFORMED_QUERY = Symbol('malformed query');

/**
 * Fastify's parser (fast-querystring) keeps such an escape as its literal text: a bulk job's reason
 * `%FF` was stored as those three characters, and a search for `%C3` searched for them. Marked
 * here and refused 400 by the onRequest hook, as a malformed path is.
 */
export function parseQueryString(text: string): Record<string, unknown> {
  const query: Record<string | symbol, unknown> = parse(text);
  if (text.includes('%')) {
    try {
      decodeURIComponent(text);
    } catch {
      query[MALFORMED_QUERY] = true;
    }
  }
  return query;
}

export function isMalformedQuery(query: unknown): boolean {
  return typeof query === 'object' && query !== null && MALFORMED_QUERY in query;
}
