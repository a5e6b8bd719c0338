// Prints a bearer token signed with the configured JWT_SECRET (from the environment or .env).
import { parseArgs } from 'node:util';
import { signToken } from '../src/auth/jwt.js';
import { Role, ROLES } from '../src/auth/principal.js';
import { USER_ID_PATTERN } from '../src/common/validation.js';
import { ConfigError, loadConfig, readEnvFile } from '../src/config/app-config.js';

const USAGE = `usage: npm run -s token -- --user <id> [--role admin|service[,...]] [--ttl seconds]

  --user  the token's subject (sub): 1-64 of [A-Za-z0-9_.:-]
  --role  admin (everything under /admin) and/or service (the order service: redeem and refund
          for any user); comma-separated or repeated; none: a plain user
  --ttl   lifetime in seconds (default 3600, at most JWT_MAX_TTL_SECONDS)

examples:
  npm run -s token -- --user alice
  npm run -s token -- --user ops --role admin
  npm run -s token -- --user order-service --role service
  npm run -s token -- --user ops --role service,admin --ttl 600`;

function fail(message: string): never {
  console.error(`token: ${message}\n\n${USAGE}`);
  process.exit(2);
}

function parse() {
  try {
    return parseArgs({
      options: {
        user: { type: 'string' },
        role: { type: 'string', multiple: true },
        ttl: { type: 'string', default: '3600' },
        help: { type: 'boolean', short: 'h' },
      },
    }).values;
  } catch (err) {
    return fail((err as Error).message);
  }
}

const values = parse();
if (values.help) {
  console.log(USAGE);
  process.exit(0);
}
const roles = [...new Set((values.role ?? []).flatMap((r) => r.split(',')).map((r) => r.trim()))];
const unknown = roles.filter((r) => !(ROLES as readonly string[]).includes(r));
if (unknown.length > 0) fail(`unknown role ${unknown.join(', ')} (roles: ${ROLES.join(', ')})`);
if (values.user === undefined) fail('--user is required');
if (!USER_ID_PATTERN.test(values.user)) fail(`--user ${JSON.stringify(values.user)} is not a valid user id`);
const ttl = Number(values.ttl);
if (!Number.isSafeInteger(ttl) || ttl < 1) fail(`--ttl must be a whole number of seconds, got ${values.ttl}`);

readEnvFile();
try {
  const config = loadConfig();
  if (ttl > config.JWT_MAX_TTL_SECONDS)
    fail(`--ttl ${ttl} is over JWT_MAX_TTL_SECONDS (${config.JWT_MAX_TTL_SECONDS}): the service would refuse the token`);
  console.log(signToken(config.JWT_SECRET, values.user, roles as Role[], ttl));
} catch (err) {
  if (!(err instanceof ConfigError)) throw err;
  console.error(`token: ${err.message}`);
  process.exit(2);
}
