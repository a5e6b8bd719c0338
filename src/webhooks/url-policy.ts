import { AppError } from '../common/errors.js';
import { validationFailed } from '../common/validation.js';

export const URL_MAX_LENGTH = 2048;

/** `*.example.com` matches every subdomain of example.com (not example.com itself); anything else matches exactly. */
export function hostAllowed(hostname: string, allowed: readonly string[]): boolean {
  if (allowed.length === 0) return true;
  const host = hostname.toLowerCase();
  return allowed.some((entry) => (entry.startsWith('*.') ? host.endsWith(entry.slice(1)) : host === entry));
}

/**
 * A webhook target: an absolute http(s) URL without credentials (they would be stored and shown in
 * the clear, and a receiver authenticates us by the signature anyway), and on the allow-list when
 * one is configured, so that an admin token cannot aim deliveries at internal services.
 */
export function checkWebhookUrl(raw: string, allowed: readonly string[]): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw validationFailed({ url: ['must be an absolute http or https URL'] });
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw validationFailed({ url: ['must use http or https'] });
  if (url.username !== '' || url.password !== '') throw validationFailed({ url: ['must not contain credentials'] });
  if (url.hostname === '') throw validationFailed({ url: ['must name a host'] });
  // Port 0 parses, but nothing can be delivered to it.
  if (url.port === '0') throw validationFailed({ url: ['must not use port 0'] });
  if (url.href.length > URL_MAX_LENGTH) throw validationFailed({ url: [`must be at most ${URL_MAX_LENGTH} characters`] });
  if (!hostAllowed(url.hostname, allowed)) {
    throw new AppError('WEBHOOK_URL_NOT_ALLOWED', `Host ${url.hostname} is not in WEBHOOK_ALLOWED_HOSTS`, { host: url.hostname });
  }
  return url.href;
}
