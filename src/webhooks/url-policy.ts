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

/** Cloud services that answer a machine's credentials outside the link-local range: Alibaba Cloud's metadata, Azure's WireServer. */
const METADATA_V4 = new Set(['100.100.100.200', '168.63.129.16']);
/** AWS's link-local services over IPv6 (metadata at ::254, the EKS Pod Identity agent at ::23). */
const AWS_V6 = ipaddr.parseCIDR('fd00:ec2::/64');
/** The ranges no webhook is delivered to, as the messages name them. */
const NEVER = new Map([
  ['linkLocal', 'a link-local address'],
  ['unspecified', 'an unspecified address'],
  ['multicast', 'a multicast address'],
  ['broadcast', 'a broadcast address'],
]);

/** The IPv4 address an IPv6 one carries and reaches (NAT64, SIIT, 6to4, IPv4-compatible), or null. */
function embeddedIPv4(ip: ipaddr.IPv6): ipaddr.IPv4 | null {
  const b = ip.toByteArray();
  // rfc6145: IPv4-translated (SIIT, ::ffff:0:0:0/96).
  const last4 = ip.range() === 'rfc6052' || ip.range() === 'rfc6145' || b.slice(0, 12).every((x) => x === 0);
  const at = last4 ? 12 : ip.range() === '6to4' ? 2 : -1;
  return at < 0 ? null : new ipaddr.IPv4(b.slice(at, at + 4));
}

function refusedIp(ip: ipaddr.IPv4 | ipaddr.IPv6): string | null {
  const range = ip.range();
  const never = NEVER.get(range);
  if (never) return never;
  if (ip.kind() === 'ipv4') return METADATA_V4.has(ip.toString()) ? 'a cloud metadata address' : null;
  if (range === 'loopback') return null;
  if (ip.match(AWS_V6)) return 'a cloud metadata address';
  const v4 = embeddedIPv4(ip as ipaddr.IPv6);
  return v4 ? refusedIp(v4) : null;
}

/**
 * Why no webhook is ever delivered to this address, or null. Link-local holds the cloud metadata
 * service (169.254.169.254), the classic target of a request forged through a webhook; the others
 * are no host at all. Private and loopback addresses stay allowed: receivers inside the shop's own
 * network are the usual case (WEBHOOK_ALLOWED_HOSTS narrows further).
 */
export function refusedAddress(address: string): string | null {
  const literal = address.replace(/^\[(.*)\]$/, '$1');
  if (!ipaddr.isValid(literal)) return null;
  return refusedIp(ipaddr.process(literal));
}

/** The code of guardedLookup's refusal: its message, which names the address and why, is the one recorded. */
export const ADDRESS_REFUSED = 'EADDRNOTALLOWED';

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
          code: ADDRESS_REFUSED,
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
