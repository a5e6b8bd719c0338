// Prints a token signed with the configured JWT_SECRET: npm run token -- --user alice [--role admin|service] [--ttl 3600]
import { parseArgs } from 'node:util';
import { signToken } from '../src/auth/jwt.js';
import { Role, ROLES } from '../src/auth/principal.js';
import { loadConfig } from '../src/config/app-config.js';

const { values } = parseArgs({
  options: { user: { type: 'string' }, role: { type: 'string', multiple: true }, ttl: { type: 'string', default: '3600' } },
});
const roles = (values.role ?? []) as Role[];
if (!values.user || roles.some((r) => !ROLES.includes(r))) {
  console.error('usage: npm run token -- --user <id> [--role admin|service] [--ttl seconds]');
  process.exit(2);
}
console.log(signToken(loadConfig().JWT_SECRET, values.user, roles, Number(values.ttl)));
