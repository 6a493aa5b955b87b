-- JSON: to_json of each type, json_build_object/array (PostgreSQL prints json_build_object
-- with " : " and json_agg with ", " between rows), json_agg, -> and ->> on objects and
-- arrays, jsonb operators and key order, row_to_json, and invalid input (22P02).

SELECT to_json('text'::text), to_json(42), to_json(1.5), to_json(true), to_json(NULL::text);

SELECT to_json(card), to_json(amount), to_json(ts), to_json(qty) FROM payments WHERE id = 6;

SELECT id, json_build_object('id', id, 'card', card, 'amount', amount) FROM payments WHERE id IN (1, 16) ORDER BY id;

SELECT json_build_array(1, 'a', NULL, 2.5);

SELECT json_agg(id ORDER BY id) FROM payments WHERE card = 'C-6';

SELECT card, json_agg(amount ORDER BY id) FROM payments WHERE card IN ('c-5', 'C-6') GROUP BY card ORDER BY card;

SELECT json_agg(t ORDER BY t.id) FROM (SELECT id, card FROM payments WHERE id <= 2) t;

SELECT json_object_agg(card, n ORDER BY card) FROM card_totals;

SELECT '{"a": {"b": [10, 20]}}'::json -> 'a' -> 'b' -> 1;

SELECT '{"a": 1, "b": "x"}'::json ->> 'b', '{"a": 1}'::json -> 'missing';

SELECT '[1, 2, 3]'::json ->> 2, '[1, 2, 3]'::jsonb -> -1;

SELECT json_build_object('card', card, 'n', n) ->> 'n' FROM card_totals WHERE card = 'c-1';

SELECT (json_build_object('amount', amount) ->> 'amount')::float8 * 2 FROM payments WHERE id = 9;

SELECT '{"a": 1}'::jsonb || '{"b": 2}'::jsonb, '{"a": 1, "b": 2}'::jsonb - 'a', '{"a": 1}'::jsonb ? 'a';

-- jsonb orders keys (shorter first) and drops duplicates
SELECT jsonb_build_object('bb', 1, 'a', 2, 'a', 3);

SELECT row_to_json(p) FROM payments p WHERE id = 7;

SELECT json_typeof('{"a": 1}'::json -> 'a'), json_array_length('[1, 2, 3]');

SELECT '{"a": 1'::json;

SELECT ('{"x": "5"}'::json ->> 'x') = '5';

SELECT json_extract_path_text('{"a": {"b": "c"}}', 'a', 'b');

SELECT * FROM json_each_text('{"a": "1", "b": "2"}') ORDER BY key;

SELECT to_json(ARRAY[1, 2, 3]), to_json(ARRAY['a', NULL]);

SELECT '{"a": [1, 2]}'::jsonb #> '{a,1}', '{"a": [1, 2]}'::json #>> '{a,0}';

SELECT '{"b": 1,  "a": [1,2]}'::json, '{"b": 1,  "a": [1,2]}'::jsonb;

SELECT jsonb_agg(amount ORDER BY id) FROM payments WHERE card = 'c-10';

SELECT id, json_build_object('ts', ts, 'ok', amount > 10, 'note', note) FROM payments WHERE id IN (3, 5) ORDER BY id;

-- More everyday queries (stop 101).
SELECT json_build_object('a', 1, 'b', 'x'), '{"a":[1,2]}'::jsonb -> 'a' ->> 1, jsonb_array_length('[1,2,3]');
