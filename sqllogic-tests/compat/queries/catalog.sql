-- Catalog queries of the shapes psql (\d, \dt, \dv), pgjdbc (getTables, getColumns) and
-- DBeaver send, over the stream (a table) and the metrics (views): names, kinds, column
-- types and nullability, privileges and visibility. Nothing here prints an oid, an owner,
-- a user or database name, or a version: those differ between the servers by design.

SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = 'payments';

SELECT c.relname, c.relkind FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' ORDER BY c.relname;

SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'payments' ORDER BY ordinal_position;

SELECT column_name, is_nullable, ordinal_position FROM information_schema.columns WHERE table_name = 'payments' ORDER BY ordinal_position;

SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'card_totals' ORDER BY ordinal_position;

-- by design: a metric's SUM of an integer column is NUMERIC, by the dialect's contract (docs/sql.md, result types), so it never overflows; PostgreSQL's sum(int4) is bigint
SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'merchant_totals' ORDER BY ordinal_position;

SELECT table_schema, table_name, table_type FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name;

SELECT table_name FROM information_schema.views WHERE table_schema = 'public' ORDER BY table_name;

SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'payments'::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum;

SELECT a.attname, a.attnum, a.attnotnull FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid WHERE c.relname = 'payments' AND a.attnum > 0 ORDER BY a.attnum;

SELECT t.typname FROM pg_type t JOIN pg_attribute a ON a.atttypid = t.oid WHERE a.attrelid = 'payments'::regclass AND a.attnum > 0 ORDER BY a.attnum;

SELECT pg_typeof(amount)::text, pg_typeof(ts)::text, pg_typeof(n)::text FROM payments JOIN card_totals USING (card) WHERE id = 1;

SELECT current_user = session_user, current_schema(), current_schemas(false);

SELECT pg_typeof(current_user), pg_typeof(current_database());

SELECT has_table_privilege('payments', 'SELECT'), has_table_privilege('card_totals', 'SELECT'), has_schema_privilege('public', 'USAGE');

SELECT pg_table_is_visible('payments'::regclass), pg_table_is_visible('card_totals'::regclass);

SELECT 'payments'::regclass::text, 'card_totals'::regclass::text;

SELECT 'nosuch'::regclass;

SELECT 'integer'::regtype::text, 'int8'::regtype::text, 'timestamp'::regtype::text;

SELECT nspname FROM pg_namespace WHERE nspname IN ('public', 'pg_catalog', 'information_schema') ORDER BY 1;

SELECT count(*) FROM pg_database WHERE datname = current_database();

SELECT relname FROM pg_class WHERE relkind = 'v' AND relnamespace = 'public'::regnamespace ORDER BY relname;

SELECT count(*) FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indrelid WHERE c.relname = 'payments';

SELECT obj_description('payments'::regclass, 'pg_class'), col_description('payments'::regclass, 1);

SELECT pg_catalog.format_type(20, NULL), format_type(1184, NULL), format_type(25, -1);

SELECT typname FROM pg_type WHERE oid IN (16, 20, 23, 25, 701, 1114) ORDER BY oid;

SELECT typname, typlen FROM pg_type WHERE typname IN ('int4', 'int8', 'float8', 'text', 'bool', 'timestamp') ORDER BY typname;

SELECT setting FROM pg_settings WHERE name = 'standard_conforming_strings';

SELECT name, setting FROM pg_settings WHERE name IN ('DateStyle', 'client_encoding') ORDER BY name;

SELECT pg_get_viewdef('card_totals'::regclass) IS NOT NULL;

-- psql's \d payments, its first query (without the oid column)
SELECT n.nspname, c.relname FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relname OPERATOR(pg_catalog.~) '^(payments)$' COLLATE pg_catalog.default AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1, 2;

-- psql's \d payments, its column query
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true) FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef), a.attnotnull, (SELECT c.collname FROM pg_catalog.pg_collation c, pg_catalog.pg_type t WHERE c.oid = a.attcollation AND t.oid = a.atttypid AND a.attcollation <> t.typcollation) AS attcollation, a.attidentity, a.attgenerated FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'payments'::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum;

-- psql's \dv (without the owner column)
SELECT n.nspname as "Schema", c.relname as "Name", CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 't' THEN 'TOAST table' WHEN 'f' THEN 'foreign table' WHEN 'p' THEN 'partitioned table' WHEN 'I' THEN 'partitioned index' END as "Type" FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('v','') AND n.nspname <> 'pg_catalog' AND n.nspname !~ '^pg_toast' AND n.nspname <> 'information_schema' AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1,2;

-- psql's \dt (without the owner column)
SELECT n.nspname as "Schema", c.relname as "Name", CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'p' THEN 'partitioned table' END as "Type" FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r','p','') AND n.nspname <> 'pg_catalog' AND n.nspname !~ '^pg_toast' AND n.nspname <> 'information_schema' AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1,2;

-- pgjdbc's getColumns, reduced to its join and filters
SELECT n.nspname, c.relname, a.attname, a.attnum, a.attnotnull OR (t.typtype = 'd' AND t.typnotnull) AS attnotnull, t.typname FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_class c ON (c.relnamespace = n.oid) JOIN pg_catalog.pg_attribute a ON (a.attrelid = c.oid) JOIN pg_catalog.pg_type t ON (a.atttypid = t.oid) WHERE c.relkind IN ('r', 'p', 'v', 'f', 'm') AND a.attnum > 0 AND NOT a.attisdropped AND n.nspname LIKE 'public' AND c.relname LIKE 'card%' ORDER BY n.nspname, c.relname, a.attnum;

-- pgjdbc's getTables, reduced
SELECT NULL AS "TABLE_CAT", n.nspname AS "TABLE_SCHEM", c.relname AS "TABLE_NAME", CASE n.nspname ~ '^pg_' OR n.nspname = 'information_schema' WHEN true THEN NULL WHEN false THEN CASE c.relkind WHEN 'r' THEN 'TABLE' WHEN 'v' THEN 'VIEW' ELSE NULL END ELSE NULL END AS "TABLE_TYPE" FROM pg_catalog.pg_namespace n, pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relname LIKE '%' AND n.nspname LIKE 'public' AND c.relkind IN ('r', 'v') ORDER BY "TABLE_TYPE", "TABLE_SCHEM", "TABLE_NAME";

-- DBeaver's first queries
SELECT current_schema(), session_user = current_user;

SELECT * FROM pg_catalog.pg_settings WHERE name = 'standard_conforming_strings' AND setting = 'on' LIMIT 0;

SELECT count(*) FROM pg_catalog.pg_enum WHERE 1 <> 1;

SELECT pg_catalog.pg_get_userbyid(c.relowner) = current_user FROM pg_catalog.pg_class c WHERE c.relname = 'payments';

SELECT c.relname, pg_catalog.pg_total_relation_size(c.oid) IS NULL FROM pg_class c WHERE c.relname = 'nosuch';

SELECT version() LIKE 'PostgreSQL %';
