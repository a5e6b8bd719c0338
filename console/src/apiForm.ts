import type { FormInstance } from 'antd';
import { ApiError, apiLanguage } from './api';

/**
 * The API's sentences an operator reads are English (per-field messages in class-validator's wording,
 * the field named as the body names it; a webhook's disabled reason): the common ones said in Chinese
 * when the console speaks it, the field left to the label above the message. Any other stays as the
 * API wrote it.
 */
const IN_CHINESE: [RegExp, (m: RegExpMatchArray) => string][] = [
  // First, and anchored at both ends: the error after "last:" is any text, which a pattern below could match.
  // Stored cut to 255 characters, the closing parenthesis may be gone.
  [/^(\d+) deliveries in a row failed every retry \(last: (.+?)\)?$/, (m) => `连续 ${m[1]} 次投递在所有重试后仍失败（最后一次：${m[2]}）`],
  [/must not be less than (\S+)$/i, (m) => `不能小于 ${m[1]}`],
  [/must not be greater than (\S+)$/i, (m) => `不能大于 ${m[1]}`],
  [/must be an integer number$/, () => '必须是整数'],
  [/should not be empty$/, () => '必填'],
  [/must not be 0$/, () => '不能为 0'],
  [/must be after validity\.startAt$/, () => '必须晚于生效时间'],
  [/must be after grabStartAt$/, () => '必须晚于抢券开始时间'],
  [/must be 1-64 of \[A-Za-z0-9_.:-\]$/, () => '须为 1–64 个字符，只含字母、数字和 _ . : -'],
  [/must be UTF-8 text$/, () => '不是 UTF-8 文本：请在 Excel 中另存为「CSV UTF-8」'],
  [/without control characters/, () => '必须是可见文字，不能只有空白，也不能含控制字符'],
  [/must be an absolute http or https URL$/, () => '必须是完整的 http 或 https 地址'],
  [/must use http or https$/, () => '必须使用 http 或 https'],
  [/must not contain credentials$/, () => '不能包含用户名或密码'],
  [/must name a host$/, () => '必须包含主机名'],
  [/must not use port 0$/, () => '不能使用端口 0'],
  [/must be at most (\d+) characters$/, (m) => `最多 ${m[1]} 个字符`],
  [/holds no user id$/, () => '没有任何用户 ID'],
  [/must be a positive integer id$/, () => '必须是正整数编号'],
  [/must be (\d+) to (\d+) characters \(Unicode code points\)$/, (m) => `须为 ${m[1]}–${m[2]} 个字符`],
];

export function said(message: string): string {
  if (apiLanguage() !== 'zh-CN') return message;
  for (const [pattern, chinese] of IN_CHINESE) {
    const m = message.match(pattern);
    if (m) return chinese(m);
  }
  return message;
}

/** The API's field messages under `from` named `to`: a body the server reads as a whole names the form field it came from. */
export function renamedField(err: unknown, from: string, to: string): unknown {
  const fields = err instanceof ApiError ? err.details?.fields : undefined;
  if (!(err instanceof ApiError) || !fields || !(from in fields)) return err;
  const { [from]: messages, ...rest } = fields;
  return new ApiError(err.status, err.code, err.message, { ...err.details, fields: { ...rest, [to]: messages } });
}

/**
 * Under its field, a message names the field by the label above it, not by the body's name for it:
 * "days must not be less than 1" reads "Must not be less than 1".
 */
function underField(path: string, message: string): string {
  const zh = said(message);
  if (zh !== message) return zh;
  const field = `${path.split('.').at(-1)} `;
  const rest = message.startsWith(field) ? message.slice(field.length) : message;
  return rest.charAt(0).toUpperCase() + rest.slice(1);
}

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
    if (!fits) unplaced.push(`${path}: ${messages.map(said).join(', ')}`);
    return fits;
  });
  form.setFields(placed.map(([path, errors]) => ({ name: path.split('.'), errors: errors.map((m) => underField(path, m)) })));
  return unplaced.length > 0 ? unplaced.join('; ') : null;
}
