\set k random(1, 4)
SELECT n, total FROM pgb_card WHERE card = 'c-' || :k;
