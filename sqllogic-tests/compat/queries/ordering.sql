-- Ordering: ASC/DESC with PostgreSQL's NULL placement (NULLs are larger than every value:
-- last ascending, first descending), NULLS FIRST/LAST, LIMIT/OFFSET, FETCH FIRST, ORDER BY
-- an ordinal, an alias or an expression. Every ORDER BY here is total, so the order of the
-- rows is part of the answer.

SELECT id, amount FROM payments ORDER BY amount, id;

SELECT id, amount FROM payments ORDER BY amount DESC, id;

SELECT id, amount FROM payments ORDER BY amount NULLS FIRST, id;

SELECT id, amount FROM payments ORDER BY amount DESC NULLS LAST, id;

SELECT id, merchant FROM payments ORDER BY merchant, id;

SELECT id, merchant FROM payments ORDER BY merchant DESC, id DESC;

-- text order by code point: 'C-6' < 'c-1' < 'c-10' < 'c-2'
SELECT card FROM payments GROUP BY card ORDER BY card;

SELECT id, ts FROM payments ORDER BY ts DESC, id DESC LIMIT 5;

SELECT id FROM payments ORDER BY id LIMIT 5 OFFSET 10;

SELECT id FROM payments ORDER BY id OFFSET 45;

SELECT id FROM payments ORDER BY id FETCH FIRST 3 ROWS ONLY;

SELECT id FROM payments ORDER BY id OFFSET 2 ROWS FETCH NEXT 2 ROWS ONLY;

SELECT id FROM payments ORDER BY id FETCH FIRST ROW ONLY;

-- WITH TIES keeps the rows that tie with the last one
SELECT qty FROM payments WHERE qty IS NOT NULL ORDER BY qty DESC FETCH FIRST 5 ROWS WITH TIES;

SELECT amount FROM payments ORDER BY amount LIMIT 3 OFFSET 1;

-- ORDER BY ordinals
SELECT id, card FROM payments ORDER BY 2, 1;

-- ORDER BY an output alias
SELECT id, amount * qty AS value FROM payments WHERE qty IS NOT NULL AND amount IS NOT NULL ORDER BY value DESC, id LIMIT 5;

-- ORDER BY an expression that is not in the select list
SELECT id, card FROM payments ORDER BY upper(card), id DESC;

SELECT id, note FROM payments WHERE note IS NOT NULL ORDER BY note, id;

SELECT card, count(*) AS n FROM payments GROUP BY card ORDER BY n DESC, card;

SELECT id FROM payments ORDER BY id DESC LIMIT 3 OFFSET 0;

SELECT id FROM payments WHERE id < 5 ORDER BY id LIMIT ALL;

SELECT id, qty FROM payments ORDER BY qty NULLS FIRST, id DESC LIMIT 8;

SELECT merchant, min(id) FROM payments GROUP BY merchant ORDER BY merchant NULLS FIRST;

-- sorting the text of a float
SELECT id, amount FROM payments WHERE amount IS NOT NULL ORDER BY amount::text, id LIMIT 8;

SELECT id, card, ts FROM payments ORDER BY card DESC, ts ASC LIMIT 6;

SELECT x FROM (VALUES (3), (1), (2)) AS v(x) ORDER BY x;

-- LIMIT takes an expression
SELECT id FROM payments ORDER BY id LIMIT 2 + 1;

SELECT id FROM payments ORDER BY id LIMIT 0;

SELECT id, ts FROM payments ORDER BY ts::date DESC, amount DESC NULLS LAST, id LIMIT 7;

SELECT id, qty FROM payments ORDER BY qty DESC NULLS FIRST, id LIMIT 8;

-- Everyday queries, run against both servers in stop 101.
SELECT DISTINCT ON (card) card, id FROM payments ORDER BY card, id DESC;

SELECT id FROM payments ORDER BY amount DESC NULLS FIRST, id LIMIT 3 OFFSET 2;

-- More everyday queries (stop 101).
SELECT id, amount FROM payments ORDER BY amount NULLS LAST, id LIMIT ALL OFFSET 45;
