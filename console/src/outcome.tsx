import { useState } from 'react';
import { Alert } from 'antd';
import { ApiError } from './api';
import { useI18n } from './i18n';

/**
 * Why a write's outcome is unknown: no answer at all (the server unreachable, the connection lost),
 * or a 503 OUTCOME_UNKNOWN (the database's answer to the COMMIT lost). Neither is the value's fault,
 * and the change may have been made.
 */
type Unsure = 'noAnswer' | 'outcomeUnknown';

/** Why `err`, a write's failure, leaves its outcome unknown; null when the server refused it (nothing was made). */
function unsureOf(err: unknown): Unsure | null {
  if (!(err instanceof ApiError)) return 'noAnswer';
  return err.code === 'OUTCOME_UNKNOWN' ? 'outcomeUnknown' : null;
}

/**
 * Whether a dialog's last write may or may not have been made. `failed(err)` after a write that threw:
 * true when its outcome is unknown (the warning shows; the dialog keeps its Idempotency-Key so OK
 * again applies the change once), false when it was refused (the dialog shows why, as before).
 */
export function useOutcome() {
  const [unsure, setUnsure] = useState<Unsure | null>(null);
  return {
    unsure,
    /** Before a write, and when the dialog opens for other values: no warning. */
    reset: () => setUnsure(null),
    failed(err: unknown): boolean {
      const why = unsureOf(err);
      setUnsure(why);
      return why !== null;
    },
  };
}

/** The warning above a form whose last write may or may not have been made; nothing while it is known. */
export function OutcomeAlert({ unsure }: { unsure: Unsure | null }) {
  const { t } = useI18n();
  if (!unsure) return null;
  return <Alert type="warning" showIcon title={t(unsure)} style={{ marginBottom: 16 }} data-testid="no-answer" />;
}
