import { statementKind } from './resumable-migration.js';

describe('statementKind', () => {
  it.each([
    ['SELECT 1', 'read'],
    ['  show tables', 'read'],
    ['SET @a = 1', 'session'],
    ['/* why */ CREATE TABLE t (id INT)', 'ddl'],
    ['-- why\n  ALTER TABLE t ADD COLUMN b INT', 'ddl'],
    ['# why\nDROP TABLE t', 'ddl'],
    ['--\nINSERT INTO t VALUES (1)', 'dml'],
    ['update t set b = 1', 'dml'],
  ])('%j is %s', (sql, kind) => expect(statementKind(sql)).toBe(kind));

  it.each([
    'WITH x AS (SELECT 1) UPDATE t SET b = 1',
    '/*!50000 CREATE TABLE t (id INT) */',
    '/*M!100500 INSERT INTO t VALUES (1) */ SELECT 1',
    'SET STATEMENT max_statement_time=60 FOR INSERT INTO t VALUES (1)',
    'CALL p()',
    '',
    '--not a comment',
  ])('refuses %j', (sql) => expect(() => statementKind(sql)).toThrow(/cannot tell whether this statement changes anything/));
});
