import { createParamDecorator, ExecutionContext, SetMetadata } from '@nestjs/common';
import { AppError } from '../common/errors.js';
import { validationFailed } from '../common/validation.js';

export type Role = 'admin' | 'service';
export const ROLES: readonly Role[] = ['admin', 'service'];

export interface Principal {
  userId: string;
  roles: Role[];
}

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by the auth guard; the request log names the user by it. */
    principal?: Principal;
  }
}

export const PUBLIC_KEY = 'auth:public';
export const ROLES_KEY = 'auth:roles';

/** No token needed. */
export const Public = () => SetMetadata(PUBLIC_KEY, true);
/** The token must carry at least one of these roles. */
export const RequireRoles = (...roles: Role[]) => SetMetadata(ROLES_KEY, roles);

export const CurrentUser = createParamDecorator((_: unknown, ctx: ExecutionContext): Principal => {
  return ctx.switchToHttp().getRequest<{ principal: Principal }>().principal;
});

/** The user a request acts for: a service names it (`userId` required), a user only themself (absent or equal). */
export function actingFor(principal: Principal, userId: string | undefined): string {
  if (principal.roles.includes('service')) {
    if (!userId) throw validationFailed({ userId: ['required with a service token'] });
    return userId;
  }
  if (userId !== undefined && userId !== principal.userId) throw new AppError('FORBIDDEN', 'A user may only act on their own coupons');
  return principal.userId;
}
