import { createSigner, createVerifier } from 'fast-jwt';
import { USER_ID_PATTERN } from '../common/validation.js';
import { Principal, Role, ROLES } from './principal.js';

type Verify = (token: string) => unknown;
type Sign = (payload: Record<string, unknown>) => string;

/**
 * fast-jwt rather than jsonwebtoken: in the flash-sale benchmark jsonwebtoken's verify was a tenth
 * of the server's CPU, and fast-jwt does it in about half the time. Its token cache is off: hashing
 * each token for the lookup cost more than it saved when most tokens are new (a sale's opening burst).
 */
const verifiers = new Map<string, Verify>();
function verifierFor(secret: string): Verify {
  let verify = verifiers.get(secret);
  if (!verify) {
    verify = createVerifier({ key: secret, algorithms: ['HS256'], requiredClaims: ['exp'] });
    verifiers.set(secret, verify);
  }
  return verify;
}

const signers = new Map<string, Sign>();
function signerFor(secret: string, expiresInSeconds: number): Sign {
  const id = `${expiresInSeconds}\u0000${secret}`;
  let sign = signers.get(id);
  if (!sign) {
    sign = createSigner({ key: secret, algorithm: 'HS256', expiresIn: expiresInSeconds * 1000 });
    signers.set(id, sign);
  }
  return sign;
}

export function signToken(secret: string, userId: string, roles: Role[] = [], expiresInSeconds = 3600): string {
  return signerFor(secret, expiresInSeconds)({ sub: userId, roles });
}

/** Verifies an HS256 token as API.md requires: signed, `exp` present and not passed, `sub` a valid user id. Returns null when any of that fails. */
export function verifyToken(secret: string, token: string): Principal | null {
  let payload: unknown;
  try {
    payload = verifierFor(secret)(token);
  } catch {
    return null;
  }
  if (typeof payload !== 'object' || payload === null) return null;
  const { sub, roles, exp } = payload as { sub?: unknown; roles?: unknown; exp?: unknown };
  if (typeof exp !== 'number' || typeof sub !== 'string' || !USER_ID_PATTERN.test(sub)) return null;
  if (roles !== undefined && (!Array.isArray(roles) || !roles.every((r) => ROLES.includes(r as Role)))) return null;
  return { userId: sub, roles: (roles as Role[] | undefined) ?? [] };
}
