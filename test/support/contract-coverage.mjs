// Which documented answers the e2e suites produced: the harness and the fault suite's client record
// every (operation, status, error code) they checked under test-results/contract-coverage/, and
// after the run this lists the documented ones no test produced (test-results/contract-coverage.txt).
// test:jest starts the record afresh; test:faults adds to it (npm test runs both, in that order).
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export const SEEN_DIR = 'test-results/contract-coverage';
const REPORT = 'test-results/contract-coverage.txt';

export function clearSeen() {
  rmSync(SEEN_DIR, { recursive: true, force: true });
  mkdirSync(SEEN_DIR, { recursive: true });
}

export function documentedAnswers(doc) {
  const answers = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      for (const [status, response] of Object.entries(op.responses)) {
        const codes = response.content?.['application/json']?.schema?.allOf?.[1]?.properties?.code?.enum;
        if (codes) for (const code of codes) answers.push(`${method.toUpperCase()} ${path} ${status} ${code}`);
        else answers.push(`${method.toUpperCase()} ${path} ${status}`);
      }
    }
  }
  return answers;
}

export function report() {
  if (!existsSync(SEEN_DIR)) return;
  const files = readdirSync(SEEN_DIR);
  if (files.length === 0) return;
  const seen = new Set(files.flatMap((f) => JSON.parse(readFileSync(join(SEEN_DIR, f), 'utf8'))));
  const documented = documentedAnswers(JSON.parse(readFileSync('docs/openapi.json', 'utf8')));
  const unseen = documented.filter((a) => !seen.has(a));
  writeFileSync(REPORT, unseen.join('\n') + '\n');
  console.log(
    `\ncontract coverage: ${documented.length - unseen.length} of ${documented.length} documented answers produced by the tests; the others: ${REPORT}`,
  );
}
