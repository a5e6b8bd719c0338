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
    // nbf is checked below with the same clock skew as iat; fast-jwt's clockTolerance would also stretch exp.
    verify = createVerifier({ key: secret, algorithms: ['HS256'], requiredClaims: ['exp'], ignoreNotBefore: true });
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

/** How far ahead of this server's clock a token's iat or nbf may lie (the issuer's clock may run fast). */
export const CLOCK_SKEW_SECONDS = 60;

const isTime = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

/**
 * Verifies an HS256 token as API.md requires: signed, `exp` present, not passed and at most
 * `maxTtlSeconds` ahead (an exp of 1e300 is a token valid forever), `iat` and `nbf` (when present)
 * at most CLOCK_SKEW_SECONDS ahead, `sub` a valid user id. Returns null when any of that fails.
 */
export function verifyToken(secret: string, token: string, maxTtlSeconds: number): Principal | null {
  let payload: unknown;
  try {
    payload = verifierFor(secret)(token);
  } catch {
    return null;
  }
  if (typeof payload !== 'object' || payload === null) return null;
  const { sub, roles, exp, iat, nbf } = payload as { sub?: unknown; roles?: unknown; exp?: unknown; iat?: unknown; nbf?: unknown };
  const now = Date.now() / 1000;
  if (!isTime(exp) || exp > now + maxTtlSeconds) return null;
  for (const t of [iat, nbf]) if (t !== undefined && (!isTime(t) || t > now + CLOCK_SKEW_SECONDS)) return null;
  if (typeof sub !== 'string' || !USER_ID_PATTERN.test(sub)) return null;
  if (roles !== undefined && (!Array.isArray(roles) || !roles.every((r) => ROLES.includes(r as Role)))) return null;
  return { userId: sub, roles: (roles as Role[] | undefined) ?? [] };
}
