import { existsSync, readFileSync } from 'node:fs';
import { parseEnv } from 'node:util';
import { plainToInstance, Transform } from 'class-transformer';
import {
  IsBoolean,
  IsIn,
  IsInt,
  isFQDN,
  isIP,
  IsOptional,
  IsString,
  IsTimeZone,
  Matches,
  Max,
  Min,
  MinLength,
  ValidateBy,
  validateSync,
} from 'class-validator';
import { CronTime, validateCronExpression } from 'cron';

const IsListenHost = () =>
  ValidateBy({
    name: 'isListenHost',
    validator: {
      validate: (v: unknown) => typeof v === 'string' && (isIP(v) || isFQDN(v, { require_tld: false })),
      defaultMessage: () => 'HOST must be an IP address or a host name',
    },
  });

/**
 * What ioredis connects to: a redis:// or rediss:// URL with a host, or its shorter forms (host:port,
 * a port, a socket path). Another scheme (http://cache:6379), a database that is not a number
 * (redis://cache/sessions) or text with spaces it would misread.
 */
const IsRedisUrl = () =>
  ValidateBy({
    name: 'isRedisUrl',
    validator: {
      validate: (v: unknown) => {
        const value = String(v);
        if (!value.includes('://')) return /^[^\s:]*(:\d{1,5})?$|^\/\S+$/.test(value) && value !== '';
        try {
          const url = new URL(value);
          // ioredis reads the path as the database number and sends SELECT with whatever it finds there.
          return (url.protocol === 'redis:' || url.protocol === 'rediss:') && url.hostname !== '' && /^(\/\d*)?$/.test(url.pathname);
        } catch {
          return false;
        }
      },
      defaultMessage: () =>
        'REDIS_URL must be redis://[:password@]host[:port][/db] (db a number; rediss:// for TLS), host:port or a socket path',
    },
  });

/** WEBHOOK_ALLOWED_HOSTS as a list of lower-case entries; empty: every host is allowed. */
export function parseAllowedHosts(value: string | undefined): string[] {
  return (value ?? '')
    .split(',')
    .map((h) => h.trim().toLowerCase())
    .filter((h) => h !== '');
}

/** Each entry of WEBHOOK_ALLOWED_HOSTS: what URL.hostname gives (names, IPv4, [IPv6]), optionally `*.`-prefixed; empty entries are skipped. */
const IsHostList = () =>
  ValidateBy({
    name: 'isHostList',
    validator: {
      validate: (v: unknown) =>
        parseAllowedHosts(String(v)).every((entry) => {
          try {
            return new URL(`http://${entry.replace(/^\*\./, 'x.')}`).hostname === entry.replace(/^\*\./, 'x.');
          } catch {
            return false;
          }
        }),
      defaultMessage: () =>
        'WEBHOOK_ALLOWED_HOSTS must be comma-separated host names or IP addresses, each optionally *.-prefixed (hooks.example.com,*.example.com)',
    },
  });

export const DEFAULT_JWT_SECRET = 'dev-only-insecure-secret-change-me';
/** Secrets copied from an example (compose files, docs) rather than generated. */
const PLACEHOLDER_SECRET = /change.?me|placeholder/i;

/** Whether a valid expression ever fires: the cron library looks 8 years ahead, and throws when the job starts. */
function fires(expression: string): boolean {
  try {
    new CronTime(expression).sendAt();
    return true;
  } catch {
    return false;
  }
}

/**
 * Checked here, not when the job is registered after connecting, so a typo stops the boot with the
 * setting's name; so does one that never fires (31 February), which failed the start with a stack trace.
 */
const IsCronExpression = () =>
  ValidateBy({
    name: 'isCronExpression',
    validator: {
      validate: (value: unknown) => typeof value === 'string' && validateCronExpression(value).valid && fires(value),
      defaultMessage: (args) =>
        `${args?.property} must be a cron expression with seconds ("0 * * * * *") or an alias such as @hourly, that fires (no 31 February); got ${JSON.stringify(args?.value)}`,
    },
  });

// Decimal digits only: Number() would take 0x0C1E, 3e3 and ' 7 ' as ports and sizes. Anything else
// stays a string, which @IsInt refuses.
const toInt = ({ value }: { value: unknown }) =>
  value === undefined || value === '' ? undefined : typeof value === 'string' && /^-?\d+$/.test(value) ? Number(value) : value;
const toBool = ({ value }: { value: unknown }) =>
  value === undefined || value === ''
    ? undefined
    : value === true || value === 'true' || value === '1'
      ? true
      : value === false || value === 'false' || value === '0'
        ? false
        : value;

/**
 * Every setting the service reads, validated once at boot. Defaults work on a developer machine
 * with MariaDB and Redis on localhost; production must at least set JWT_SECRET.
 */
export class AppConfig {
  @IsIn(['development', 'production', 'test'])
  @IsOptional()
  NODE_ENV: string = 'development';

  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(65535)
  PORT: number = 3000;

  /** The listening address: 0.0.0.0 (all IPv4 interfaces), :: (all), 127.0.0.1 (this machine only), or a host name. */
  @IsListenHost()
  HOST: string = '0.0.0.0';

  @Matches(/^[A-Za-z0-9._:-]{1,255}$/, { message: 'DB_HOST must be a host name or an IP address' })
  DB_HOST: string = '127.0.0.1';

  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(65535)
  DB_PORT: number = 3306;

  /**
   * Several database hosts for failover (`h1:3306,h2:3306,h3:3306`): new connections go to the
   * first host in this order that accepts them, so list this instance's own node first. Set, it
   * replaces DB_HOST and DB_PORT. See docs/cluster.md.
   */
  @IsOptional()
  @Matches(/^[A-Za-z0-9._-]+:\d{1,5}(,[A-Za-z0-9._-]+:\d{1,5}){0,15}$/, {
    message: 'DB_HOSTS must be 1-16 comma-separated host:port entries, e.g. db1:3306,db2:3306',
  })
  DB_HOSTS?: string = undefined;

  @IsString()
  DB_USER: string = 'root';

  @IsString()
  DB_PASSWORD: string = '';

  @Matches(/^[A-Za-z0-9_]{1,64}$/, { message: 'DB_NAME must be 1-64 of [A-Za-z0-9_]' })
  DB_NAME: string = 'coupon';

  @Transform(toInt)
  @IsInt()
  @Min(2)
  @Max(1000)
  DB_POOL_SIZE: number = 20;

  /**
   * Every request's deadline: a client still sending its request then is answered 408, work still
   * unfinished then 503. A request's database waits all end before it (deadline-pool.ts).
   */
  @Transform(toInt)
  @IsInt()
  @Min(1000)
  @Max(600_000)
  REQUEST_TIMEOUT_MS: number = 10_000;

  /**
   * How long a SIGTERM or SIGINT may take to stop the instance (jobs, requests in flight, the pool)
   * before it exits anyway, code 1, naming what it still waited for. The default leaves room inside
   * Kubernetes' 30 s grace period for a preStop delay, and is above REQUEST_TIMEOUT_MS so the
   * requests in flight can finish.
   */
  @Transform(toInt)
  @IsInt()
  @Min(1000)
  @Max(3_600_000)
  SHUTDOWN_TIMEOUT_MS: number = 20_000;

  /**
   * How long a stopping instance goes on serving, with `/health` answering 503 and every answer
   * closing its connection, before its listener closes: time for a load balancer or Kubernetes'
   * readiness probe to take it out, so that no client writes a request to a connection as it
   * closes. Counted within SHUTDOWN_TIMEOUT_MS. 0 (the default) closes at the signal.
   */
  @Transform(toInt)
  @IsInt()
  @Min(0)
  @Max(600_000)
  SHUTDOWN_DRAIN_MS: number = 0;

  /** Outside requests (jobs), a statement unanswered this long ends, its connection closed; a request's statements end at its deadline. */
  @Transform(toInt)
  @IsInt()
  @Min(100)
  @Max(600_000)
  DB_STATEMENT_TIMEOUT_MS: number = 30_000;

  /** Outside requests (jobs), waiting for a pool connection (or for a new one to open) gives up after this long; a request waits until its deadline. */
  @Transform(toInt)
  @IsInt()
  @Min(100)
  @Max(600_000)
  DB_ACQUIRE_TIMEOUT_MS: number = 10_000;

  /** innodb_lock_wait_timeout of the service's connections; with DB_TX_RETRIES, how long a request may queue on a row lock. */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(3600)
  DB_LOCK_WAIT_TIMEOUT_SECONDS: number = 5;

  /**
   * MariaDB's idle_transaction_timeout on the service's connections: a session left inside a
   * transaction this long is closed by the server, its locks released. The service never leaves a
   * transaction idle by design; a session whose client was cut off by a network partition does,
   * and held its row locks (every retry of those orders 503) until wait_timeout, 8 hours by
   * default. 0 leaves the server's own setting (its global value). MySQL has no such setting and ignores it.
   */
  @Transform(toInt)
  @IsInt()
  @Min(0)
  @Max(3600)
  DB_IDLE_TRANSACTION_TIMEOUT_SECONDS: number = 10;

  /** How many times inTransaction() retries a deadlock or lock-wait timeout in a fresh transaction. */
  @Transform(toInt)
  @IsInt()
  @Min(0)
  @Max(20)
  DB_TX_RETRIES: number = 3;

  /**
   * How long a write whose COMMIT answer was lost keeps trying to learn whether it committed,
   * before answering 503 OUTCOME_UNKNOWN; inside a request it ends by the request's deadline whatever this says.
   */
  @Transform(toInt)
  @IsInt()
  @Min(100)
  @Max(60_000)
  OUTCOME_RESOLVE_MS: number = 5000;

  /** How long a job's lease (src/database/lease.ts) lasts without renewal: how soon another instance takes over a job whose holder died. */
  @Transform(toInt)
  @IsInt()
  @Min(1000)
  @Max(600_000)
  LEASE_TTL_MS: number = 30_000;

  @IsString()
  @MinLength(16)
  JWT_SECRET: string = DEFAULT_JWT_SECRET;

  /** Tokens whose exp lies further ahead are refused: a token must not be valid (nearly) forever. */
  @Transform(toInt)
  @IsInt()
  @Min(60)
  @Max(10 * 366 * 86_400)
  JWT_MAX_TTL_SECONDS: number = 31 * 86_400;

  /**
   * When set, GET /metrics needs `Authorization: Bearer <METRICS_TOKEN>`. Its syntax is the bearer
   * token's (b64token: `=` only at the end), or a token accepted here could never be presented.
   */
  @Matches(/^(?=.{16,512}$)[A-Za-z0-9._~+/-]+=*$/, {
    message: 'METRICS_TOKEN must be 16-512 of [A-Za-z0-9._~+/-], optionally ending in =',
  })
  @IsOptional()
  METRICS_TOKEN?: string = undefined;

  /**
   * Origins whose pages may call the API from a browser (the marketing front end on its own domain),
   * comma-separated, each exactly as browsers send it in `Origin`: lowercase, no path, no trailing
   * slash. Unset: no CORS headers, so browsers allow only pages of the service's own origin.
   */
  @IsOptional()
  @Matches(/^https?:\/\/[a-z0-9.-]+(:\d{1,5})?(,https?:\/\/[a-z0-9.-]+(:\d{1,5})?){0,31}$/, {
    message:
      'CORS_ORIGINS must be 1-32 comma-separated origins like https://shop.example.com or http://localhost:5173 (lowercase, no path)',
  })
  CORS_ORIGINS?: string = undefined;

  /** Serve the OpenAPI UI at /docs and the document at /docs-json (on by default in every environment). */
  @Transform(toBool)
  @IsBoolean()
  DOCS_ENABLED: boolean = true;

  /** Initialised (to undefined) so that loadConfig() knows the name and reads it from the environment. */
  @IsRedisUrl()
  @IsOptional()
  REDIS_URL?: string = undefined;

  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(1_000_000)
  RATE_LIMIT_PER_SECOND: number = 500;

  @Transform(toBool)
  @IsBoolean()
  RATE_LIMIT_ENABLED: boolean = true;

  /** Grabs one user may make per second on one instance, whatever the coupon. */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(10_000)
  RATE_LIMIT_PER_USER_PER_SECOND: number = 5;

  @IsCronExpression()
  RECONCILE_CRON: string = '0 0 3 * * *';

  @IsTimeZone({ message: 'RECONCILE_TIMEZONE must be an IANA time zone such as UTC or Asia/Shanghai; got $value' })
  RECONCILE_TIMEZONE: string = 'UTC';

  /** Chunks of the user-coupon and redemption audits read at once, each on a connection of its own. */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(16)
  RECONCILE_CONCURRENCY: number = 2;

  @IsCronExpression()
  EXPIRE_CRON: string = '0 * * * * *';

  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(100_000)
  EXPIRE_BATCH_SIZE: number = 1000;

  /** How long a checkout hold lasts when the request does not say (ttlSeconds). */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(86_400)
  HOLD_TTL_SECONDS: number = 900;

  /**
   * Whether a user's own token may hold, redeem and release (API.md's default). False: only the order
   * service puts coupons on orders, so no shopper can take another customer's order number first.
   */
  @Transform(toBool)
  @IsBoolean()
  REDEMPTIONS_BY_USERS: boolean = true;

  /** How often the hold sweep releases timed-out holds; readers treat them as released already. */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(3600)
  HOLD_SWEEP_SECONDS: number = 10;

  /** How long a coupon template (status, window, limits) may be served from memory. */
  @Transform(toInt)
  @IsInt()
  @Min(0)
  @Max(60_000)
  COUPON_CACHE_TTL_MS: number = 1000;

  /** grouped: concurrent grabs of one coupon share one transaction; per-request: one transaction each. */
  @IsIn(['grouped', 'per-request'])
  GRAB_STRATEGY: 'grouped' | 'per-request' = 'grouped';

  /** Most grabs one grouped transaction decides: enough for a whole burst of 1,000 concurrent grabs. */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(5000)
  GRAB_GROUP_MAX: number = 1000;

  /** How long the first grab of an idle coupon waits for company before its group runs (0: to the end of the event-loop turn). */
  @Transform(toInt)
  @IsInt()
  @Min(0)
  @Max(1000)
  GRAB_GROUP_WAIT_MS: number = 0;

  @Transform(toBool)
  @IsBoolean()
  SCHEDULER_ENABLED: boolean = true;

  @IsIn(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])
  LOG_LEVEL: string = 'info';

  /** Run the webhook relay on this instance (one instance at a time relays; the others stand by). */
  @Transform(toBool)
  @IsBoolean()
  WEBHOOK_RELAY_ENABLED: boolean = true;

  /** Comma-separated hosts webhook URLs may name (`hooks.example.com`, `*.example.com`); unset: any host. */
  @IsHostList()
  @IsOptional()
  WEBHOOK_ALLOWED_HOSTS?: string = undefined;

  /** How long one delivery attempt may take before it counts as failed. */
  @Transform(toInt)
  @IsInt()
  @Min(100)
  @Max(60_000)
  WEBHOOK_TIMEOUT_MS: number = 10_000;

  /** Seconds to wait before each retry; after the last one the delivery is FAILED. The default spans 31.7 hours. */
  @Matches(/^\d{1,6}(,\d{1,6}){0,49}$/, { message: 'WEBHOOK_RETRY_DELAYS must be a comma-separated list of whole seconds' })
  WEBHOOK_RETRY_DELAYS: string = '5,30,120,600,1800,3600,7200,14400,28800,28800,28800';

  /** Deliveries in a row that must fail every retry before their endpoint is disabled. */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(1000)
  WEBHOOK_DISABLE_AFTER_FAILURES: number = 5;

  /** How often the relay looks for new state-log rows and due deliveries when nothing woke it. */
  @Transform(toInt)
  @IsInt()
  @Min(10)
  @Max(10_000)
  WEBHOOK_POLL_MS: number = 200;

  /** Concurrent deliveries per endpoint. */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(1000)
  WEBHOOK_MAX_IN_FLIGHT: number = 100;

  /**
   * Only when information_schema.innodb_trx cannot be read (no PROCESS privilege) or keeps answering
   * from a stale cache: how long a gap in the state-log ids is waited for, i.e. the longest a
   * transaction writing the log may stay open.
   */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(86_400)
  WEBHOOK_GAP_MAX_AGE_SECONDS: number = 600;
  /** Run bulk issuance jobs on this instance (one instance at a time runs them; the others stand by). */
  @Transform(toBool)
  @IsBoolean()
  BULK_RUNNER_ENABLED: boolean = true;

  /**
   * The deadline of a bulk issuance upload (every other request has REQUEST_TIMEOUT_MS): long enough for 64 MiB to arrive and be
   * stored; and of a job's skipped or unprocessed lines as CSV (line-csvs.ts), a million lines streamed to a client as slow.
   */
  @Transform(toInt)
  @IsInt()
  @Min(1000)
  @Max(3_600_000)
  BULK_UPLOAD_TIMEOUT_MS: number = 600_000;

  /** Lines of a bulk issuance job decided by one transaction (it holds the coupon's stock row that long). */
  @Transform(toInt)
  @IsInt()
  @Min(1)
  @Max(10_000)
  BULK_BATCH_SIZE: number = 1000;

  /** Unset: pretty (pino-pretty) when NODE_ENV is development, JSON lines otherwise. */
  @IsIn(['json', 'pretty'])
  @IsOptional()
  LOG_FORMAT?: 'json' | 'pretty' = undefined;
}

export class ConfigError extends Error {}

/**
 * Puts the settings of ./.env (if there is one) into process.env, where loadConfig() validates them
 * with everything else; a variable set in the shell wins over the file. Node's own parser rather
 * than @nestjs/config: the service, the migration CLI and the scripts all need the settings before
 * any Nest module exists.
 */
export function readEnvFile(path = '.env'): void {
  if (!existsSync(path)) return;
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`Cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  // A byte order mark (Windows editors write one) made the first name "\uFEFFDB_NAME", silently unset.
  for (const [name, value] of Object.entries(parseEnv(text.replace(/^\uFEFF/, '')))) {
    if (process.env[name] === undefined) process.env[name] = value;
  }
}

/** What a stop needs after the last request's deadline: a job's batch, the pool's close. */
const SHUTDOWN_CLOSE_MARGIN_MS = 2000;

export function loadConfig(env: Record<string, string | undefined> = process.env): AppConfig {
  const defaults = new AppConfig() as unknown as Record<string, unknown>;
  // An optional setting left empty (`REDIS_URL=` in a .env or compose file) is unset; a required one left
  // empty is refused, and so is an empty METRICS_TOKEN: a secret missing from the environment must not open /metrics.
  const given = (k: string) => env[k] !== undefined && !(env[k] === '' && defaults[k] === undefined && k !== 'METRICS_TOKEN');
  const raw = Object.fromEntries(
    Object.keys(defaults)
      .filter(given)
      .map((k) => [k, env[k]]),
  );
  const config = plainToInstance(AppConfig, raw, { exposeDefaultValues: true });
  const errors = validateSync(config, { forbidUnknownValues: false });
  if (errors.length > 0) {
    // A value that is not a number at all is only told so, not also that it is out of range.
    const lines = errors.map(
      (e) => `${e.property}: ${(e.constraints?.isInt ? [e.constraints.isInt] : Object.values(e.constraints ?? {})).join(', ')}`,
    );
    throw new ConfigError(`Invalid configuration:\n  ${lines.join('\n  ')}`);
  }
  if (config.DB_HOSTS !== undefined) {
    const hosts = databaseHosts(config);
    const bad = hosts.filter((h) => h.port < 1 || h.port > 65535).map((h) => `${h.host}:${h.port}`);
    if (bad.length > 0) throw new ConfigError(`Invalid configuration:\n  DB_HOSTS: port out of 1-65535 in ${bad.join(', ')}`);
    if (new Set(hosts.map((h) => `${h.host}:${h.port}`)).size !== hosts.length)
      throw new ConfigError('Invalid configuration:\n  DB_HOSTS: a host:port is listed twice');
  }
  // The close after the drain still finishes a request started at its end, a job's batch and the pool.
  const closeMs = config.REQUEST_TIMEOUT_MS + SHUTDOWN_CLOSE_MARGIN_MS;
  if (config.SHUTDOWN_DRAIN_MS > 0 && config.SHUTDOWN_DRAIN_MS + closeMs > config.SHUTDOWN_TIMEOUT_MS) {
    throw new ConfigError(
      `Invalid configuration:\n  SHUTDOWN_DRAIN_MS: the drain (${config.SHUTDOWN_DRAIN_MS} ms), a request's deadline after it (REQUEST_TIMEOUT_MS, ${config.REQUEST_TIMEOUT_MS} ms) and ${SHUTDOWN_CLOSE_MARGIN_MS} ms to close must fit in SHUTDOWN_TIMEOUT_MS (${config.SHUTDOWN_TIMEOUT_MS} ms)`,
    );
  }
  if (config.NODE_ENV === 'production' && retryDelays(config).reduce((a, b) => a + b, 0) < 86_400) {
    throw new ConfigError('WEBHOOK_RETRY_DELAYS must add up to at least 86400 seconds (24 hours) in production.');
  }
  if (config.NODE_ENV === 'production' && (config.JWT_SECRET === DEFAULT_JWT_SECRET || PLACEHOLDER_SECRET.test(config.JWT_SECRET))) {
    throw new ConfigError(
      'Refusing to start in production with the default JWT_SECRET or a placeholder one: set JWT_SECRET to a long random string (openssl rand -hex 32).',
    );
  }
  return config;
}

export interface DatabaseHost {
  host: string;
  port: number;
}

/** The database hosts in order of preference: DB_HOSTS, or the single DB_HOST:DB_PORT. */
export function databaseHosts(c: Pick<AppConfig, 'DB_HOSTS' | 'DB_HOST' | 'DB_PORT'>): DatabaseHost[] {
  if (c.DB_HOSTS === undefined) return [{ host: c.DB_HOST, port: c.DB_PORT }];
  return c.DB_HOSTS.split(',').map((entry) => {
    const [host, port] = entry.split(':');
    return { host, port: Number(port) };
  });
}

/** WEBHOOK_RETRY_DELAYS in seconds. */
export function retryDelays(config: Pick<AppConfig, 'WEBHOOK_RETRY_DELAYS'>): number[] {
  return config.WEBHOOK_RETRY_DELAYS.split(',').map(Number);
}
