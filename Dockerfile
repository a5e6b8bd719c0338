FROM node:20-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
RUN npm run build && npm prune --omit=dev
ENV NODE_ENV=production
# The same node flags as `npm run start:prod` (see the README, "The two commands").
CMD ["node", "--max-semi-space-size=64", "dist/src/main.js"]
