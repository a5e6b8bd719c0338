/** The admin token lives in this tab's sessionStorage only: closing the tab signs out. */
const KEY = 'coupon-console.token';

interface Claims {
  sub?: string;
  roles?: string[];
  exp?: number;
}

export function readClaims(token: string): Claims | null {
  const part = token.split('.')[1];
  if (!part) return null;
  try {
    const json = atob(
      part
        .replace(/-/g, '+')
        .replace(/_/g, '/')
        .padEnd(Math.ceil(part.length / 4) * 4, '='),
    );
    const claims = JSON.parse(json) as unknown;
    return typeof claims === 'object' && claims !== null ? (claims as Claims) : null;
  } catch {
    return null;
  }
}

/** Why a token cannot be used, or null. The server is the judge; this only spares a useless round trip. */
export function tokenProblem(token: string, nowMs = Date.now()): 'malformed' | 'expired' | 'notAdmin' | null {
  const claims = readClaims(token);
  if (!claims || typeof claims.exp !== 'number') return 'malformed';
  if (claims.exp * 1000 <= nowMs) return 'expired';
  if (!claims.roles?.includes('admin')) return 'notAdmin';
  return null;
}

export function storedToken(): string | null {
  return sessionStorage.getItem(KEY);
}

export function storeToken(token: string): void {
  sessionStorage.setItem(KEY, token);
}

export function clearToken(): void {
  sessionStorage.removeItem(KEY);
}

/**
 * `/console/#token=<JWT>` signs in: the token moves to sessionStorage and the fragment is removed
 * from the address bar (and so from history) before anything renders.
 */
export function takeTokenFromLocation(): string | null {
  const params = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  const token = params.get('token');
  if (token === null) return null;
  history.replaceState(null, '', window.location.pathname + window.location.search);
  return token.trim();
}
