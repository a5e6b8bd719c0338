import { createSecretKey, KeyObject } from 'node:crypto';
import jwt from 'jsonwebtoken';
import { USER_ID_PATTERN } from '../common/validation.js';
import { Principal, Role, ROLES } from './principal.js';

/**
 * jsonwebtoken first tries a string secret as a PEM key and only then as an HMAC secret, which costs
 * about 0.7 ms of CPU per call; a KeyObject made once costs about 15 µs.
 */
const keys = new Map<string, KeyObject>();
function keyFor(secret: string): KeyObject {
  let key = keys.get(secret);
  if (!key) keys.set(secret, (key = createSecretKey(Buffer.from(secret, 'utf8'))));
  return key;
}

export function signToken(secret: string, userId: string, roles: Role[] = [], expiresInSeconds = 3600): string {
  return jwt.sign({ sub: userId, roles }, keyFor(secret), { algorithm: 'HS256', expiresIn: expiresInSeconds });
}

/** Verifies an HS256 token as API.md requires: signed, `exp` present and not passed, `sub` a valid user id. Returns null when any of that fails. */
export function verifyToken(secret: string, token: string): Principal | null {
  let payload: unknown;
  try {
    payload = jwt.verify(token, keyFor(secret), { algorithms: ['HS256'] });
  } catch {
    return null;
  }
  if (typeof payload !== 'object' || payload === null) return null;
  const { sub, roles, exp } = payload as { sub?: unknown; roles?: unknown; exp?: unknown };
  if (typeof exp !== 'number' || typeof sub !== 'string' || !USER_ID_PATTERN.test(sub)) return null;
  if (roles !== undefined && (!Array.isArray(roles) || !roles.every((r) => ROLES.includes(r as Role)))) return null;
  return { userId: sub, roles: (roles as Role[] | undefined) ?? [] };
}
