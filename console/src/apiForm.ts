import type { FormInstance } from 'antd';
import { ApiError } from './api';

/**
 * Puts the API's validation messages (`details.fields`, keyed by body path like "discount.amountCents")
 * under the form items of the same name. Returns what could not be placed, for an alert.
 */
export function showApiErrors(form: FormInstance, err: unknown, known: string[][]): string | null {
  if (!(err instanceof ApiError)) return (err as Error).message;
  const fields = err.details?.fields;
  if (!fields) return `${err.code}: ${err.message}`;
  const unplaced: string[] = [];
  const placed = Object.entries(fields).filter(([path, messages]) => {
    const name = path.split('.');
    const fits = known.some((k) => k.join('.') === name.join('.'));
    if (!fits) unplaced.push(`${path}: ${messages.join(', ')}`);
    return fits;
  });
  form.setFields(placed.map(([path, errors]) => ({ name: path.split('.'), errors })));
  return unplaced.length > 0 ? unplaced.join('; ') : null;
}
