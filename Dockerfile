# syntax=docker/dockerfile:1
# Three stages: compile with the dev dependencies, install the production ones alone, and a runtime
# image with just those and the build, run as the unprivileged `node` user.

FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ormconfig.ts ./
COPY src ./src
COPY scripts ./scripts
# The admin console, built by Vite into dist/console.
COPY console ./console
RUN npm run build

FROM node:20-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force

FROM node:20-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
# package.json for the npm scripts: migration:run|show|revert (typeorm is a production dependency),
# token and check:invariants; without src/ scripts/ensure-built.mjs takes dist/ as built.
COPY --from=deps --chown=root:root /app/node_modules ./node_modules
COPY --from=build --chown=root:root /app/dist ./dist
COPY --chown=root:root package.json ./
COPY --chown=root:root scripts/ensure-built.mjs ./scripts/ensure-built.mjs
USER node
EXPOSE 3000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.PORT || 3000) + '/health').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# The same node flags as `npm run start:prod` (see the README, "The two commands"); node is PID 1's
# only process, so `docker stop` (SIGTERM) reaches it and it shuts down gracefully.
CMD ["node", "--max-semi-space-size=64", "dist/src/main.js"]
