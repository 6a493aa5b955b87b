-- The catalog queries DBeaver's navigator sends to a PostgreSQL server as it connects and
-- opens a schema, a table and a view (namespaces, types, relations with sizes, columns
-- with defaults and dependencies, indexes, constraints, a view's definition), in their
-- shapes: `SELECT n.oid, n.*`, niladic `session_user`, `'pg_class'::regclass`, the size
-- and statistics functions. Run by pg_catalog's tests: every one must plan and run. Oids
-- 16384 and 16385 are the test's stream and metric.
SELECT current_schema(), session_user;
SELECT n.oid, n.*, d.description FROM pg_catalog.pg_namespace n LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid = n.oid AND d.objsubid = 0 AND d.classoid = 'pg_namespace'::regclass ORDER BY nspname;
SELECT n.nspname = ANY(current_schemas(true)), n.nspname, t.typname FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON t.typnamespace = n.oid WHERE t.oid = 1034;
SELECT db.oid, db.* FROM pg_catalog.pg_database db WHERE datname = 'eddy';
SELECT * FROM pg_catalog.pg_settings WHERE name = 'standard_conforming_strings';
SELECT version();
SELECT * FROM pg_catalog.pg_enum WHERE 1 <> 1 LIMIT 1;
SELECT reltype FROM pg_catalog.pg_class WHERE 1 <> 1 LIMIT 1;
SELECT t.oid, t.*, c.relkind, format_type(nullif(t.typbasetype, 0), t.typtypmod) AS base_type_name, d.description FROM pg_catalog.pg_type t LEFT OUTER JOIN pg_catalog.pg_type et ON et.oid = t.typelem LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid = t.typrelid LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid = d.objoid WHERE t.typname IS NOT NULL AND (c.relkind IS NULL OR c.relkind = 'c') AND (et.typcategory IS NULL OR et.typcategory <> 'C');
SELECT c.oid, c.*, d.description, pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS partition_expr, pg_catalog.pg_get_partkeydef(c.oid) AS partition_key FROM pg_catalog.pg_class c LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid = c.oid AND d.objsubid = 0 AND d.classoid = 'pg_class'::regclass WHERE c.relnamespace = 2200 AND c.relkind NOT IN ('i', 'I', 'c');
SELECT c.oid, pg_catalog.pg_total_relation_size(c.oid) AS total_rel_size, pg_catalog.pg_relation_size(c.oid) AS rel_size FROM pg_class c WHERE c.relnamespace = 2200;
SELECT c.relname, a.*, pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) AS def_value, dsc.description, dep.objid FROM pg_catalog.pg_attribute a INNER JOIN pg_catalog.pg_class c ON (a.attrelid = c.oid) LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid = ad.adrelid AND a.attnum = ad.adnum) LEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid = dsc.objoid AND a.attnum = dsc.objsubid) LEFT OUTER JOIN pg_depend dep ON dep.refobjid = a.attrelid AND dep.deptype = 'i' AND dep.refobjsubid = a.attnum AND dep.classid = dep.refclassid WHERE NOT a.attisdropped AND c.relkind NOT IN ('i', 'I', 'c') AND c.oid = 16384 ORDER BY a.attnum;
SELECT i.*, i.indkey AS keys, c.relname, c.relnamespace, c.relam, c.reltablespace, tc.relname AS tabrelname, dsc.description, pg_catalog.pg_get_expr(i.indpred, i.indrelid) AS pred_expr, pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) AS expr, pg_catalog.pg_relation_size(i.indexrelid) AS index_rel_size, pg_catalog.pg_stat_get_numscans(i.indexrelid) AS index_num_scans FROM pg_catalog.pg_index i INNER JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid INNER JOIN pg_catalog.pg_class tc ON tc.oid = i.indrelid LEFT OUTER JOIN pg_catalog.pg_description dsc ON i.indexrelid = dsc.objoid WHERE i.indrelid = 16384 ORDER BY tabrelname, c.relname;
SELECT c.oid, c.*, t.relname AS tabrelname, rt.relnamespace AS refnamespace, d.description, CASE WHEN c.contype = 'c' THEN "substring"(pg_get_constraintdef(c.oid), 7) ELSE NULL END AS consrc_copy FROM pg_catalog.pg_constraint c INNER JOIN pg_catalog.pg_class t ON t.oid = c.conrelid LEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid = c.confrelid LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid = c.oid AND d.objsubid = 0 AND d.classoid = 'pg_constraint'::regclass WHERE c.conrelid = 16384 ORDER BY c.oid;
SELECT pg_catalog.pg_get_viewdef(16385, true) AS definition;
