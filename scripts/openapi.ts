import { writeFileSync } from 'node:fs';
import { CLIENT_TYPES, OPENAPI_JSON, renderClientTypes, renderDocument } from './openapi-render.js';

// Regenerates the committed document and the typed client from the code; test/openapi.spec.ts fails until both are current.
const json = await renderDocument();
writeFileSync(OPENAPI_JSON, json);
writeFileSync(CLIENT_TYPES, await renderClientTypes(json));
console.log(`wrote ${OPENAPI_JSON} and ${CLIENT_TYPES}`);
