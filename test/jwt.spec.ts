import { createHmac } from 'node:crypto';
import { signToken, verifyToken } from '../src/auth/jwt.js';

const SECRET = 'jwt-spec-secret-0123456789';
const MAX_TTL = 31 * 86_400;
const now = () => Math.floor(Date.now() / 1000);
const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
const handSigned = (payload: Record<string, unknown>, secret = SECRET) => {
  const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(payload)}`;
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`;
};

describe('verifyToken', () => {
  it('accepts what signToken signs, with its roles', () => {
    expect(verifyToken(SECRET, signToken(SECRET, 'alice', ['admin']), MAX_TTL)).toEqual({ userId: 'alice', roles: ['admin'] });
    expect(verifyToken(SECRET, signToken(SECRET, 'bob'), MAX_TTL)).toEqual({ userId: 'bob', roles: [] });
  });

  it('refuses another secret, a missing exp, and a bad sub', () => {
    expect(verifyToken(SECRET, signToken('another-secret-0123456789', 'alice'), MAX_TTL)).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'alice' }), MAX_TTL)).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'has space', exp: Math.floor(Date.now() / 1000) + 60 }), MAX_TTL)).toBeNull();
  });

  it('a token verified while valid is refused once its exp has passed', async () => {
    // At least a whole second of validity left, then wait until just past exp.
    const exp = Math.floor(Date.now() / 1000) + 2;
    const token = handSigned({ sub: 'carol', exp });
    expect(verifyToken(SECRET, token, MAX_TTL)).toEqual({ userId: 'carol', roles: [] });
    expect(verifyToken(SECRET, token, MAX_TTL)).toEqual({ userId: 'carol', roles: [] });
    await new Promise((r) => setTimeout(r, exp * 1000 - Date.now() + 50));
    expect(verifyToken(SECRET, token, MAX_TTL)).toBeNull();
  });

  it('refuses an exp more than the maximum lifetime ahead (1e300 would be valid forever), accepts one at it', () => {
    expect(verifyToken(SECRET, handSigned({ sub: 'dave', exp: 1e300 }), MAX_TTL)).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'dave', exp: now() + MAX_TTL + 5 }), MAX_TTL)).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'dave', exp: now() + MAX_TTL - 5 }), MAX_TTL)).toEqual({ userId: 'dave', roles: [] });
    expect(verifyToken(SECRET, handSigned({ sub: 'dave', exp: now() + 3600 }), 600)).toBeNull();
  });

  it.each(['iat', 'nbf'])('refuses a %s more than 60 s ahead, accepts one within the clock skew', (claim) => {
    const exp = now() + 3600;
    expect(verifyToken(SECRET, handSigned({ sub: 'erin', exp, [claim]: now() + 120 }), MAX_TTL)).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'erin', exp, [claim]: now() + 30 * 86_400 }), MAX_TTL)).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'erin', exp, [claim]: 'soon' }), MAX_TTL)).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'erin', exp, [claim]: now() + 30 }), MAX_TTL)).toEqual({ userId: 'erin', roles: [] });
    expect(verifyToken(SECRET, handSigned({ sub: 'erin', exp, [claim]: now() - 30 }), MAX_TTL)).toEqual({ userId: 'erin', roles: [] });
  });
});
