import { useCallback, useEffect, useRef, useState } from 'react';

/**
 * Loads with `load` now, again whenever `deps` change, and every `everyMs` if given. A poll never
 * overlaps the previous one, and an answer that arrives after a newer request started is dropped.
 */
export function usePoll<T>(load: () => Promise<T>, deps: unknown[], everyMs?: number) {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<Error | undefined>(undefined);
  const [loading, setLoading] = useState(true);
  const generation = useRef(0);
  const busy = useRef(false);
  const run = useCallback(load, deps);

  const reload = useCallback(async () => {
    const mine = ++generation.current;
    busy.current = true;
    setLoading(true);
    try {
      const value = await run();
      if (mine === generation.current) {
        setData(value);
        setError(undefined);
      }
    } catch (err) {
      if (mine === generation.current) setError(err as Error);
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
      if (!busy.current) void reload();
    }, everyMs);
    return () => clearInterval(timer);
  }, [reload, everyMs]);

  return { data, error, loading, reload };
}
