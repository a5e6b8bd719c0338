import jwt from 'jsonwebtoken';
import { USER_ID_PATTERN } from '../common/validation.js';
import { Principal, Role, ROLES } from './principal.js';

export function signToken(secret: string, userId: string, roles: Role[] = [], expiresInSeconds = 3600): string {
  return jwt.sign({ sub: userId, roles }, secret, { algorithm: 'HS256', expiresIn: expiresInSeconds });
}

/** Verifies an HS256 token as API.md requires: signed, `exp` present and not passed, `sub` a valid user id. Returns null when any of that fails. */
export function verifyToken(secret: string, token: string): Principal | null {
  let payload: unknown;
  try {
    payload = jwt.verify(token, secret, { algorithms: ['HS256'] });
  } catch {
    return null;
  }
  if (typeof payload !== 'object' || payload === null) return null;
  const { sub, roles, exp } = payload as { sub?: unknown; roles?: unknown; exp?: unknown };
  if (typeof exp !== 'number' || typeof sub !== 'string' || !USER_ID_PATTERN.test(sub)) return null;
  if (roles !== undefined && (!Array.isArray(roles) || !roles.every((r) => ROLES.includes(r as Role)))) return null;
  return { userId: sub, roles: (roles as Role[] | undefined) ?? [] };
}
