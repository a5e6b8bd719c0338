import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState } from 'react';
import { Grid } from 'antd';
import { ApiError, newIdempotencyKey } from './api';

/**
 * Loads with `load` now, again whenever `deps` change, and every `everyMs` if given. A poll never
 * overlaps the previous one, and an answer that arrives after a newer request started is dropped.
 * A 404 or a 400 stops the polling (what it reads does not exist, or is not a name of anything:
 * asking every second will not change that);
 * a change of `deps` or a reload() starts it again.
 */
export function usePoll<T>(load: () => Promise<T>, deps: unknown[], everyMs?: number) {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<Error | undefined>(undefined);
  const [loading, setLoading] = useState(true);
  const generation = useRef(0);
  const busy = useRef(false);
  const gone = useRef(false);
  const run = useCallback(load, deps);

  const reload = useCallback(async () => {
    const mine = ++generation.current;
    busy.current = true;
    setLoading(true);
    try {
      const value = await run();
      if (mine === generation.current) {
        gone.current = false;
        setData(value);
        setError(undefined);
      }
    } catch (err) {
      if (mine === generation.current) {
        // 400 too: a malformed id (/campaigns/abc) is no more likely to be taken next second.
        gone.current = err instanceof ApiError && (err.status === 404 || err.status === 400);
        setError(err as Error);
      }
    } finally {
      if (mine === generation.current) {
        busy.current = false;
        setLoading(false);
      }
    }
  }, [run]);

  useEffect(() => {
    void reload();
    if (!everyMs) return;
    const timer = setInterval(() => {
      if (!busy.current && !gone.current) void reload();
    }, everyMs);
    return () => clearInterval(timer);
  }, [reload, everyMs]);

  return { data, error, loading, reload };
}

/**
 * A dialog's subject and whether it is open. Closed, it keeps its subject until the closing
 * animation ends (`afterClose`): a dialog unmounted at once never runs antd's close, which gives
 * the focus back to the element that opened it.
 */
export function useDialog<T>() {
  const [shown, setShown] = useState<{ of: T; open: boolean } | null>(null);
  return {
    of: shown?.of ?? null,
    open: shown?.open ?? false,
    show: (of: T) => setShown({ of, open: true }),
    close: () => setShown((s) => s && { ...s, open: false }),
    // Opened again while it was closing: that one stays.
    afterClose: () => setShown((s) => (s?.open ? s : null)),
  };
}

/**
 * Gives the focus back to the element that had it when a drawer destroyed on close
 * (`destroyOnHidden`) opened. Ant Design 6 returns it only from the drawer's afterOpenChange, which
 * for such a drawer never brought it back (not even a handler of our own there): the focus fell to
 * the page's body. Drawers that stay mounted return the focus themselves.
 */
export function useDrawerFocusReturn(open: boolean): void {
  const opener = useRef<Element | null>(null);
  // A layout effect, to run before the drawer's autofocus (an effect) moves the focus into it.
  useLayoutEffect(() => {
    if (open) opener.current = document.activeElement;
  }, [open]);
  // An effect, to run after the drawer's focus trap has let go (in its effect's cleanup).
  useEffect(() => {
    if (open || !opener.current) return;
    if (opener.current instanceof HTMLElement && opener.current.isConnected) opener.current.focus({ preventScroll: true });
    opener.current = null;
  }, [open]);
}

/** One page of a list the API pages with a cursor. */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export interface PagedList<T> {
  items: T[] | undefined;
  /** The API has rows past the ones shown. */
  more: boolean;
  loadMore(): void;
  loading: boolean;
  error: Error | undefined;
  reload(): Promise<void>;
}

/**
 * A list the API pages with `nextCursor`: the first page, and one more page per `loadMore()`. Every
 * refresh (poll, reload) reads again as many pages as are shown, so no row drops off the end; a
 * change of `deps` starts again from the first page. `everyMs` may depend on the rows read.
 */
export function usePagedList<T>(
  loadPage: (cursor: string | undefined) => Promise<Page<T>>,
  deps: unknown[],
  everyMs?: number | ((items: T[]) => number),
): PagedList<T> {
  const depsKey = JSON.stringify(deps);
  const [shown, setShown] = useState({ depsKey, pages: 1 });
  const pages = shown.depsKey === depsKey ? shown.pages : 1;
  const [every, setEvery] = useState(typeof everyMs === 'number' ? everyMs : undefined);
  const poll = usePoll(
    async () => {
      const items: T[] = [];
      let cursor: string | null = null;
      for (let i = 0; i < pages; i++) {
        const page: Page<T> = await loadPage(cursor ?? undefined);
        items.push(...page.items);
        cursor = page.nextCursor;
        if (!cursor) break;
      }
      setEvery(typeof everyMs === 'function' ? everyMs(items) : everyMs);
      return { items, more: cursor !== null };
    },
    [depsKey, pages],
    every,
  );
  return {
    items: poll.data?.items,
    more: poll.data?.more ?? false,
    loadMore: () => setShown({ depsKey, pages: pages + 1 }),
    loading: poll.loading,
    error: poll.error,
    reload: poll.reload,
  };
}

/**
 * The Idempotency-Key for what a form is about to send: the same for every submit of the same values,
 * so an operator's retry after a lost answer gets the first request's result instead of doing it again.
 * `renew()` when the values change and after a success.
 */
export function useIdempotencyKey(): [string, () => void] {
  const [key, setKey] = useState(newIdempotencyKey);
  const renew = useCallback(() => setKey(newIdempotencyKey()), []);
  return [key, renew];
}

/**
 * The same, made at the first submit rather than at render: for forms on pages that must render
 * whatever the browser offers (the campaigns page holds the stock and create forms).
 */
export function useLazyIdempotencyKey(): { take(): string; renew(): void } {
  const key = useRef<string | null>(null);
  return useMemo(
    () => ({
      take: () => (key.current ??= newIdempotencyKey()),
      renew: () => {
        key.current = null;
      },
    }),
    [],
  );
}

/**
 * Where a table's actions column is pinned: at the table's right edge however far it scrolls, except
 * on a phone (below antd's sm), where the pinned column hid all but a sliver of the others.
 */
export function useActionsPin(): 'right' | undefined {
  return Grid.useBreakpoint().sm === false ? undefined : 'right';
}
