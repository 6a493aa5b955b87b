-- Strings: ||, length in characters and bytes (UTF-8), case mapping, substr/substring,
-- position, replace, split_part, trim, lpad/rpad, format, concat/concat_ws, LIKE/ILIKE,
-- regular expressions, and comparison by code point (the database is C.UTF-8).

SELECT card || '-' || id FROM payments WHERE id <= 3 ORDER BY id;

SELECT 'abc' || NULL, NULL || 'abc';

SELECT id, length(merchant), char_length(merchant), octet_length(merchant) FROM payments WHERE id IN (1, 3) ORDER BY id;

SELECT id, upper(merchant), lower(merchant) FROM payments WHERE id IN (1, 3, 4) ORDER BY id;

SELECT initcap('hello wORLD'), initcap(note) FROM payments WHERE id = 43;

SELECT substr('Eddy streams', 3), substr('Eddy streams', 3, 4), substring('Eddy streams' from 6 for 3);

SELECT substr('abc', 0, 2), substr('abc', -1, 3), substr('abc', 5);

SELECT position('a' in 'banana'), strpos('banana', 'na'), position('x' in 'banana');

SELECT id, replace(merchant, 'a', 'A') FROM payments WHERE id IN (1, 3) ORDER BY id;

SELECT split_part(note, ',', 2), split_part(note, ',', 5), split_part(note, ',', -1) FROM payments WHERE id = 9;

SELECT '[' || trim(note) || ']', '[' || ltrim(note) || ']', '[' || rtrim(note) || ']', '[' || btrim(note) || ']' FROM payments WHERE id = 17;

SELECT trim(both 'x' from 'xxhixx'), trim(leading '0' from '000123'), trim(trailing '.' from 'end...');

SELECT lpad(card, 6, '*'), rpad(card, 6, '.'), lpad('abcdef', 3) FROM payments WHERE id = 1;

SELECT format('%s paid %s', card, amount) FROM payments WHERE id = 9;

SELECT format('%I.%L', 'my table', 'it''s'), format('[%5s][%-5s]', 'a', 'b'), format('%s and %s', 'x', NULL);

SELECT concat('a', NULL, 'b', 1), concat_ws(', ', 'x', NULL, 'y');

SELECT id, concat_ws(' / ', card, merchant, note) FROM payments WHERE id IN (1, 7, 9) ORDER BY id;

SELECT id FROM payments WHERE merchant LIKE 'B%';

SELECT id FROM payments WHERE merchant ILIKE 'b%';

SELECT id, merchant FROM payments WHERE merchant LIKE '_a%';

-- backslash escapes a wildcard by default
SELECT id FROM payments WHERE note LIKE '50\% off';

-- NOT LIKE over NULL is NULL: rows without a note are not returned
SELECT id FROM payments WHERE note NOT LIKE '%e%';

SELECT 'abc' LIKE 'ABC', 'abc' ILIKE 'ABC', 'a_c' LIKE 'a\_c', 'abc' LIKE 'a%c';

SELECT regexp_replace('2026-10-25', '(\d+)-(\d+)-(\d+)', '\3/\2/\1');

SELECT regexp_replace(merchant, '[aeiou]', '#', 'g') FROM payments WHERE id = 1;

SELECT regexp_replace('aaa', 'a', 'b'), regexp_replace('aaa', 'a', 'b', 'g');

SELECT 'Bakery' ~ '^B', 'Bakery' ~* '^b', 'Bakery' !~ 'x';

SELECT left('streaming', 3), right('streaming', 3), reverse('abc'), repeat('ab', 3);

SELECT ascii('A'), chr(65), md5('eddy');

SELECT id, starts_with(card, 'c-1') FROM payments WHERE id IN (1, 9, 12) ORDER BY id;

SELECT translate('12345', '143', 'ax');

SELECT quote_ident('Card'), quote_ident('card'), quote_literal('O''Brien'), quote_nullable(NULL);

SELECT string_to_array('a,b,c', ','), array_to_string(ARRAY['x', 'y'], '-');

SELECT 'a' < 'b', 'B' < 'a', 'é' > 'z', 'c-10' < 'c-2';

SELECT id, note FROM payments WHERE note = 'O''Brien';

SELECT length(''), '' IS NULL, length(NULL);

SELECT upper(NULL), lower('ÀÉÎ'), upper('straße');

SELECT to_hex(255), to_hex(-1);

SELECT overlay('Txxxxas' placing 'hom' from 2 for 4);

SELECT regexp_match('card c-10 paid', 'c-(\d+)'), regexp_matches('a1b2', '\d', 'g') ORDER BY 2;

SELECT merchant, length(merchant) FROM payments WHERE merchant IS NOT NULL GROUP BY merchant ORDER BY length(merchant) DESC, merchant;

SELECT E'tab\there', 'it''s', $$dollar 'quoted'$$;

SELECT 'x' || 1 || true, 1 || 'x';

SELECT lower(card) = 'c-6', card FROM payments WHERE id = 12;

-- SIMILAR TO matches the whole text with an SQL pattern: % and _ are wildcards, . is
-- itself, groups and alternatives are regex's, ESCAPE names the escape character.
SELECT id, merchant FROM payments WHERE merchant SIMILAR TO '%(a|e)_' ORDER BY id;

SELECT 'abc' SIMILAR TO 'a%', 'abc' SIMILAR TO 'a.c', 'a.c' SIMILAR TO 'a.c', 'a%' SIMILAR TO 'a#%' ESCAPE '#', 'abc' NOT SIMILAR TO '_b%';

-- bytea reads hex and escape text and prints hex.
SELECT 'abc'::bytea, '\x41 42'::bytea, 'a\000b'::bytea, length('\x0102'::bytea), md5('\x61'::bytea), pg_typeof('x'::bytea);

SELECT '\x4'::bytea;

-- Everyday queries, run against both servers in stop 101.
SELECT upper(card), initcap(merchant), lpad(card, 8, '*'), rpad(card, 8), reverse(card), repeat('ab', 2) FROM payments ORDER BY id LIMIT 3;

SELECT split_part('a,b,c', ',', 2), position('b' IN 'abc'), strpos('abc', 'c'), substr('abcdef', 2, 3), left('abc', -1), right('abc', 2);

SELECT translate('abc', 'ab', 'xy'), replace('aaa', 'a', 'bb'), btrim('  x  '), ltrim('xxy', 'x'), chr(65), ascii('A');

SELECT format('%s-%s', 1, 'a'), format('%I', 'A b'), format('%L', 'it''s'), quote_literal('x'), quote_ident('Y');

SELECT regexp_replace('abc123', '[0-9]+', 'N'), regexp_replace('aaa', 'a', 'b', 'g'), 'abc' ~ '^a', 'abc' ~* 'B', 'abc' !~ 'z';

SELECT length(note), char_length(card), octet_length('é'), bit_length('ab') FROM payments ORDER BY id LIMIT 3;

SELECT 'a' || NULL, concat('a', NULL, 'b'), concat_ws('-', 'a', NULL, 'b'), 'x' || 1 || 2.5;

-- More everyday queries (stop 101).
SELECT 'abc' LIKE 'a_c', 'a%c' LIKE 'a\%c', 'ABC' ILIKE 'abc', 'abc' NOT LIKE '%d', 'a_c' LIKE 'a$_c' ESCAPE '$';

SELECT substring('hello' FROM 2 FOR 3), substring('hello', 3), overlay('hello' PLACING 'XX' FROM 2 FOR 2), trim(both 'x' FROM 'xxaxx');

SELECT md5('abc'), encode('abc'::bytea, 'base64'), decode('YWJj', 'base64'), encode('abc', 'hex');

SELECT starts_with('abc', 'ab'), 'abc' ^@ 'a', length('héllo'), upper('straße'), lower('ÀB');

SELECT to_char(1234.5::numeric, '9999.99'), to_char(timestamp '2026-07-04 09:05:00', 'HH12:MI AM'), to_char(interval '25 hours', 'HH24:MI');

SELECT random() < 2, length(gen_random_uuid()::text);

-- SHA-2 digests (bytea)
SELECT sha256('abc'::bytea), sha224('abc'), encode(sha512('\x00ff'::bytea), 'hex'), sha384(''::bytea), sha256(NULL::bytea);

-- length and octet_length of a bytea count its bytes.
SELECT length('\xe282ac'::bytea), octet_length('\xe282ac'::bytea), length('\xff00'::bytea), octet_length('€');
