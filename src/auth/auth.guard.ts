import { CanActivate, ExecutionContext, Injectable } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { AppConfig } from '../config/app-config.js';
import { AppError } from '../common/errors.js';
import { verifyToken } from './jwt.js';
import { Principal, PUBLIC_KEY, Role, ROLES_KEY } from './principal.js';

@Injectable()
export class AuthGuard implements CanActivate {
  constructor(
    private readonly reflector: Reflector,
    private readonly config: AppConfig,
  ) {}

  canActivate(context: ExecutionContext): boolean {
    const targets = [context.getHandler(), context.getClass()];
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_KEY, targets)) return true;
    const request = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined>; principal?: Principal }>();
    const match = /^Bearer ([A-Za-z0-9_\-.=]+)$/.exec(request.headers.authorization ?? '');
    const principal = match ? verifyToken(this.config.JWT_SECRET, match[1]) : null;
    if (!principal) throw new AppError('UNAUTHENTICATED', 'A valid bearer token is required');
    request.principal = principal;
    const required = this.reflector.getAllAndOverride<Role[] | undefined>(ROLES_KEY, targets);
    if (required && !required.some((r) => principal.roles.includes(r))) {
      throw new AppError('FORBIDDEN', `This route needs the role ${required.join(' or ')}`);
    }
    return true;
  }
}
