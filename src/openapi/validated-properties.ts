import { ApiProperty, type ApiPropertyOptions } from '@nestjs/swagger';
import { getMetadataStorage } from 'class-validator';
import type { ValidationMetadata } from 'class-validator/types/metadata/ValidationMetadata.js';

/** What a class-validator rule says about a property, in JSON Schema words. */
function fromRule(m: ValidationMetadata): Record<string, unknown> {
  const [a, b] = (m.constraints ?? []) as unknown[];
  switch (m.name) {
    case 'isInt':
      return { type: 'integer' };
    case 'min':
      return { minimum: a };
    case 'max':
      return { maximum: a };
    case 'textLength':
    case 'isLength':
      return { minLength: a, ...(typeof b === 'number' ? { maxLength: b } : {}) };
    case 'minLength':
      return { minLength: a };
    case 'maxLength':
      return { maxLength: a };
    case 'matches':
      return { pattern: a instanceof RegExp ? a.source : a };
    case 'isIso8601':
      return { format: 'date-time' };
    case 'arrayMinSize':
      return { minItems: a };
    case 'arrayMaxSize':
      return { maxItems: a };
    case 'arrayUnique':
      return { uniqueItems: true };
    case 'notEquals':
      return { not: { const: a } };
    default:
      return {};
  }
}

/**
 * Request bodies and queries are checked by class-validator; the document states the very same
 * rules (integer, bounds, lengths in code points, patterns, date-time, list sizes, excluded values) by reading them from the
 * validators, so a DTO's @ApiProperty only needs what validators cannot say (descriptions,
 * enums, examples). Runs before SwaggerModule.createDocument.
 */
export function describeValidatedProperties(): void {
  // class-validator lists the classes it validates only in this private map (no public getter).
  const storage = getMetadataStorage() as unknown as { validationMetadatas: Map<new () => object, ValidationMetadata[]> };
  for (const [target, rules] of storage.validationMetadatas) {
    const derived = new Map<string, Record<string, unknown>>();
    for (const rule of rules) {
      if (rule.each) continue;
      derived.set(rule.propertyName, { ...derived.get(rule.propertyName), ...fromRule(rule) });
    }
    for (const [property, options] of derived) {
      if (Object.keys(options).length > 0) ApiProperty(options as ApiPropertyOptions)(target.prototype, property);
    }
  }
}
