import { createHmac } from 'node:crypto';
import { signToken, verifyToken } from '../src/auth/jwt.js';

const SECRET = 'jwt-spec-secret-0123456789';
const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
const handSigned = (payload: Record<string, unknown>, secret = SECRET) => {
  const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(payload)}`;
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`;
};

describe('verifyToken', () => {
  it('accepts what signToken signs, with its roles', () => {
    expect(verifyToken(SECRET, signToken(SECRET, 'alice', ['admin']))).toEqual({ userId: 'alice', roles: ['admin'] });
    expect(verifyToken(SECRET, signToken(SECRET, 'bob'))).toEqual({ userId: 'bob', roles: [] });
  });

  it('refuses another secret, a missing exp, and a bad sub', () => {
    expect(verifyToken(SECRET, signToken('another-secret-0123456789', 'alice'))).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'alice' }))).toBeNull();
    expect(verifyToken(SECRET, handSigned({ sub: 'has space', exp: Math.floor(Date.now() / 1000) + 60 }))).toBeNull();
  });

  it('a token verified while valid is refused once its exp has passed', async () => {
    // At least a whole second of validity left, then wait until just past exp.
    const exp = Math.floor(Date.now() / 1000) + 2;
    const token = handSigned({ sub: 'carol', exp });
    expect(verifyToken(SECRET, token)).toEqual({ userId: 'carol', roles: [] });
    expect(verifyToken(SECRET, token)).toEqual({ userId: 'carol', roles: [] });
    await new Promise((r) => setTimeout(r, exp * 1000 - Date.now() + 50));
    expect(verifyToken(SECRET, token)).toBeNull();
  });
});
