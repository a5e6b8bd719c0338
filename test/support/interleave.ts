import { jest } from '@jest/globals';
import type { DataSource } from 'typeorm';

/**
 * Runs `write` (to commit elsewhere) just before the app's first statement matching `before` is
 * sent, on every connection `app` hands out until `restore()`: a read split over several statements
 * is caught between two of them. `ran` says whether it happened.
 */
export function interleaveBefore(app: DataSource, before: (sql: string) => boolean, write: () => Promise<unknown>) {
  const createQueryRunner = app.createQueryRunner.bind(app);
  const state = { ran: 0, restore: () => spy.mockRestore() };
  const spy = jest.spyOn(app, 'createQueryRunner').mockImplementation((mode) => {
    const qr = createQueryRunner(mode);
    const query = qr.query.bind(qr);
    qr.query = (async (sql: string, ...rest: unknown[]) => {
      if (state.ran === 0 && before(sql)) {
        state.ran++;
        await write();
      }
      return query(sql, ...(rest as []));
    }) as typeof qr.query;
    return qr;
  });
  return state;
}
