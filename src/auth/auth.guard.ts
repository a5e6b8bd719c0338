import type { IncomingMessage } from 'node:http';
import { CanActivate, ExecutionContext, Injectable } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import type { FastifyRequest } from 'fastify';
import { AppConfig } from '../config/app-config.js';
import { AppError } from '../common/errors.js';
import { verifyToken } from './jwt.js';
import { Principal, PUBLIC_KEY, Role, ROLES_KEY } from './principal.js';

/**
 * The token of the request's one `Authorization: Bearer` header, else null. Node keeps only the first
 * of two Authorization headers, so a second one (which a proxy or another hop may have read instead)
 * is looked for in the raw headers and refuses the request. The token is RFC 6750's b64token, so a
 * METRICS_TOKEN of standard base64 (`+`, `/`) is read whole; a JWT uses only a subset of it. The
 * scheme is case-insensitive (RFC 7235).
 */
export function bearerToken(request: IncomingMessage): string | null {
  const raw = request.rawHeaders;
  let seen = 0;
  for (let i = 0; i < raw.length; i += 2) if (raw[i].length === 13 && raw[i].toLowerCase() === 'authorization') seen++;
  if (seen !== 1) return null;
  return /^Bearer ([A-Za-z0-9\-._~+/]+=*)$/i.exec(request.headers.authorization ?? '')?.[1] ?? null;
}

/** The principal of the request's bearer token, noted on the request for its log line; null without a valid one. */
export function authenticate(request: FastifyRequest, config: AppConfig): Principal | null {
  const principal = principalOf(request.raw, config);
  if (principal) request.principal = principal;
  return principal;
}

/** The principal of the request's bearer token; null without a valid one. */
export function principalOf(request: IncomingMessage, config: AppConfig): Principal | null {
  const token = bearerToken(request);
  return token ? verifyToken(config.JWT_SECRET, token, config.JWT_MAX_TTL_SECONDS) : null;
}

@Injectable()
export class AuthGuard implements CanActivate {
  constructor(
    private readonly reflector: Reflector,
    private readonly config: AppConfig,
  ) {}

  canActivate(context: ExecutionContext): boolean {
    const targets = [context.getHandler(), context.getClass()];
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_KEY, targets)) return true;
    const request = context.switchToHttp().getRequest<FastifyRequest>();
    const principal = authenticate(request, this.config);
    if (!principal) throw new AppError('UNAUTHENTICATED', 'A valid bearer token is required');
    const required = this.reflector.getAllAndOverride<Role[] | undefined>(ROLES_KEY, targets);
    if (required && !required.some((r) => principal.roles.includes(r))) {
      throw new AppError('FORBIDDEN', `This route needs the role ${required.join(' or ')}`);
    }
    return true;
  }
}
