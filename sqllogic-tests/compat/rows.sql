-- The rows both servers hold: the same INSERT statements run on Eddy (into the stream) and
-- on PostgreSQL (into the table). Columns: id, ts, card, merchant, amount, qty, note.
-- Batches are sent out of event-time order (ids 11-19 after 20-30, 45 before 44), all
-- within the stream's lateness, so every row is accepted.
INSERT INTO payments VALUES
  (1, '2026-10-24 08:15:00', 'c-1', 'Bakery', 12.5, 2, 'first purchase'),
  (2, '2026-10-24 09:00:00', 'c-2', 'bookshop', 35.25, 1, NULL),
  (3, '2026-10-24 09:30:30.5', 'c-3', 'Café Noir', 4.75, 3, NULL),
  (4, '2026-10-24 11:45:00', 'c-1', 'ACME Corp', 250, 10, NULL),
  (5, '2026-10-24 12:00:00', 'c-4', 'gas-station', 60, NULL, 'fuel'),
  (6, '2026-10-24 13:20:15.123456', 'c-2', 'Bakery', 8.5, 4, NULL),
  (7, '2026-10-24 18:05:00', 'c-5', NULL, 0.1, 1, 'tiny'),
  (8, '2026-10-24 18:06:00', 'c-3', NULL, 0.2, 1, 'tiny'),
  (9, '2026-10-24 22:59:59', 'c-10', 'bookshop', 19.99, 1, 'a,b,c'),
  (10, '2026-10-25 00:30:00', 'c-1', 'Café Noir', 3.5, 1, NULL);
INSERT INTO payments VALUES
  (20, '2026-10-26 07:30:00', 'c-1', 'gas-station', 55, NULL, 'fuel'),
  (21, '2026-10-26 08:00:00', 'c-4', 'bookshop', 22.5, 3, '50% off'),
  (22, '2026-10-26 12:12:12.12', 'C-6', 'Bakery', 9.75, 2, NULL),
  (23, '2026-10-26 12:30:00', 'c-2', 'Café Noir', 4.5, 1, 'O''Brien'),
  (24, '2026-10-26 16:00:00', 'c-3', 'ACME Corp', 300, 2000000000, 'bulk order'),
  (25, '2026-10-26 19:45:00', 'c-1', 'Bakery', 12.5, 2, NULL),
  (26, '2026-10-26 21:00:00', 'c-5', 'bookshop', 15, 1, NULL),
  (27, '2026-10-27 06:00:00', 'c-2', 'gas-station', 70.25, NULL, 'fuel'),
  (28, '2026-10-27 09:15:00', 'c-10', 'Bakery', 5.5, 2, NULL),
  (29, '2026-10-27 11:11:11', 'c-4', 'Café Noir', 3.25, 1, NULL),
  (30, '2026-10-27 13:00:00', 'c-1', 'ACME Corp', 499.5, 20, NULL);
INSERT INTO payments VALUES
  (11, '2026-10-25 00:59:59.999', 'c-3', 'Bakery', 6.25, 2, NULL),
  (12, '2026-10-25 01:00:00', 'C-6', 'ACME Corp', 1e6, 1, 'big ticket'),
  (13, '2026-10-25 01:30:00', 'c-2', 'gas-station', 45.5, NULL, NULL),
  (14, '2026-10-25 02:15:00', 'c-4', 'Bakery', 2.25, 12, NULL),
  (15, '2026-10-25 10:00:00', 'c-1', 'bookshop', -12.5, 2, 'refund'),
  (16, '2026-10-25 10:00:00', 'c-3', NULL, NULL, NULL, NULL),
  (17, '2026-10-25 14:45:00', 'c-10', 'Café Noir', 7.75, 1, '  padded  '),
  (18, '2026-10-25 23:59:59.5', 'c-2', 'ACME Corp', 125.25, 5, NULL),
  (19, '2026-10-26 00:00:00', 'c-5', 'Bakery', 0, 0, 'free sample');
INSERT INTO payments VALUES
  (31, '2026-10-27 15:30:00', 'c-3', 'bookshop', 12.5, 1, 'gift'),
  (32, '2026-10-27 20:00:00.000001', 'c-2', 'Bakery', 7.25, 3, NULL),
  (33, '2026-10-28 08:00:00', 'C-6', NULL, 16, 6, NULL),
  (34, '2026-10-28 09:30:00', 'c-5', 'gas-station', 38, NULL, 'fuel'),
  (35, '2026-10-28 10:45:30.75', 'c-1', 'Café Noir', 5.25, 1, NULL),
  (36, '2026-10-28 14:00:00', 'c-4', 'ACME Corp', 175, 7, NULL),
  (37, '2026-10-28 18:30:00', 'c-2', 'bookshop', 28, 2, 'gift'),
  (38, '2026-10-29 07:00:00', 'c-3', 'Bakery', 11, 4, NULL),
  (39, '2026-10-29 12:00:00', 'c-10', 'gas-station', 65.5, NULL, 'fuel'),
  (40, '2026-10-29 17:25:00', 'c-1', 'bookshop', 18.75, 2, NULL),
  (41, '2026-10-30 08:40:00', 'c-5', 'Café Noir', 6, 2, NULL),
  (42, '2026-10-30 11:00:00', 'c-2', 'ACME Corp', 89.5, 3, NULL),
  (43, '2026-10-30 19:19:19.19', 'c-4', 'Bakery', 13.5, 3, 'Birthday Cake'),
  (45, '2026-10-31 12:00:00', 'c-1', NULL, 100, NULL, 'cash advance'),
  (44, '2026-10-31 09:00:00', 'C-6', 'bookshop', 24, 1, NULL),
  (46, '2026-10-31 23:00:00', 'c-3', 'gas-station', 50.75, NULL, 'fuel'),
  (47, '2026-11-01 01:59:00', 'c-2', 'Café Noir', 3.75, 1, NULL),
  (48, '2026-11-01 06:00:00', 'c-10', 'ACME Corp', 210, 4, NULL),
  (49, '2026-11-01 06:00:00.5', 'c-5', 'Bakery', 9, 3, NULL),
  (50, '2026-11-01 12:34:56.789', 'c-1', 'bookshop', 31.5, 2, 'last one');
