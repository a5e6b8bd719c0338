import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import openapiTS, { astToString, COMMENT_HEADER, type OpenAPI3 } from 'openapi-typescript';
import { AppModule } from '../src/app.module.js';
import { loadConfig } from '../src/config/app-config.js';
import { buildOpenApiDocument } from '../src/openapi/document.js';

export const OPENAPI_JSON = 'docs/openapi.json';
export const CLIENT_TYPES = 'client/schema.d.ts';

/** The document as the service builds it; preview mode wires the routes without connecting to anything. */
export async function renderDocument(): Promise<string> {
  const app = await NestFactory.create(AppModule.forRoot(loadConfig({})), new FastifyAdapter(), { preview: true, logger: false });
  try {
    return JSON.stringify(buildOpenApiDocument(app), null, 2) + '\n';
  } finally {
    await app.close();
  }
}

/** The TypeScript types openapi-fetch's createClient<paths>() takes, generated from the document. */
export async function renderClientTypes(documentJson: string): Promise<string> {
  // A request field with a default may be left out: defaultNonNullable would make it required.
  return COMMENT_HEADER + astToString(await openapiTS(JSON.parse(documentJson) as OpenAPI3, { defaultNonNullable: false }));
}
