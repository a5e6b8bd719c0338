import { createParamDecorator, ExecutionContext, SetMetadata } from '@nestjs/common';

export type Role = 'admin' | 'service';
export const ROLES: readonly Role[] = ['admin', 'service'];

export interface Principal {
  userId: string;
  roles: Role[];
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
