import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import type { LookupFunction } from 'node:net';
import ipaddr from 'ipaddr.js';
import { AppError } from '../common/errors.js';
import { validationFailed } from '../common/validation.js';

export const URL_MAX_LENGTH = 2048;

/** `*.example.com` matches every subdomain of example.com (not example.com itself); anything else matches exactly. */
export function hostAllowed(hostname: string, allowed: readonly string[]): boolean {
  if (allowed.length === 0) return true;
  const host = hostname.toLowerCase();
  return allowed.some((entry) => (entry.startsWith('*.') ? host.endsWith(entry.slice(1)) : host === entry));
}

/** Cloud metadata services outside the link-local range: AWS's over IPv6, Alibaba Cloud's. */
const METADATA = new Set(['fd00:ec2:0:0:0:0:0:254', '100.100.100.200']);
const NEVER = new Set(['linkLocal', 'unspecified', 'multicast', 'broadcast']);

/**
 * Why no webhook is ever delivered to this address, or null. Link-local holds the cloud metadata
 * service (169.254.169.254), the classic target of a request forged through a webhook; the others
 * are no host at all. Private and loopback addresses stay allowed: receivers inside the shop's own
 * network are the usual case (WEBHOOK_ALLOWED_HOSTS narrows further).
 */
export function refusedAddress(address: string): string | null {
  const literal = address.replace(/^\[(.*)\]$/, '$1');
  if (!ipaddr.isValid(literal)) return null;
  const ip = ipaddr.process(literal);
  if (NEVER.has(ip.range())) return `a ${ip.range()} address`;
  return METADATA.has(ip.toNormalizedString()) ? 'a cloud metadata address' : null;
}

/**
 * dns.lookup for the delivery connections, refusing a name that resolves to an address
 * refusedAddress() names (any of its addresses), at each connection: a name checked when the
 * endpoint was saved could point elsewhere by delivery time.
 */
export const guardedLookup: LookupFunction = (hostname, options, callback) => {
  dnsLookup(hostname, { ...options, all: true }, (err, addresses: LookupAddress[]) => {
    if (err) return callback(err, '', 0);
    for (const a of addresses) {
      const why = refusedAddress(a.address);
      if (why) {
        const refused = Object.assign(new Error(`${hostname} resolves to ${a.address}, ${why}, where no webhook is delivered`), {
          code: 'EADDRNOTALLOWED',
        });
        return callback(refused, '', 0);
      }
    }
    if (options.all) return (callback as unknown as (e: null, all: LookupAddress[]) => void)(null, addresses);
    callback(null, addresses[0].address, addresses[0].family);
  });
};

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
  const refused = refusedAddress(url.hostname);
  if (refused) {
    throw new AppError('WEBHOOK_URL_NOT_ALLOWED', `Host ${url.hostname} is ${refused}, where no webhook is delivered`, {
      host: url.hostname,
    });
  }
  if (!hostAllowed(url.hostname, allowed)) {
    throw new AppError('WEBHOOK_URL_NOT_ALLOWED', `Host ${url.hostname} is not in WEBHOOK_ALLOWED_HOSTS`, { host: url.hostname });
  }
  return url.href;
}
