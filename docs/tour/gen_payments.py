#!/usr/bin/env python3
"""Writes payments.csv, the events the README's psql tour loads with \\copy.

The rows match the tour's stream `payments` (id, ts, card, merchant, amount), in CSV
without a header line, as `(FORMAT csv)` reads them:
- ids 3 to 1002 (the tour inserts ids 1 and 2 by hand);
- event times from 2026-11-22 10:02:01, each 0 to 2 seconds after the one before, so
  that none is late: the tour's last hand-made event is at 10:02:00 and every event is
  at or after the stream time of its task;
- cards c-1 to c-50, merchants m-1 to m-20, amounts from 1.00 to 200.00, small ones
  more often than large ones.

The seed is fixed, so running it again writes the same file:
    python3 docs/tour/gen_payments.py            # writes docs/tour/payments.csv
    python3 docs/tour/gen_payments.py -          # writes to stdout
"""

import datetime
import pathlib
import random
import sys

FIRST_ID = 3
ROWS = 1000
START = datetime.datetime(2026, 11, 22, 10, 2, 1)
CARDS = 50
MERCHANTS = 20
SEED = 2026


def rows():
    # Only rng.random(): its sequence for a seed is the same in every Python 3.
    rng = random.Random(SEED)
    ts = START
    for i in range(ROWS):
        if i > 0:
            ts += datetime.timedelta(seconds=int(rng.random() * 3))
        card = 1 + int(rng.random() * CARDS)
        merchant = 1 + int(rng.random() * MERCHANTS)
        cents = 100 + int(rng.random() ** 3 * 19900)
        yield f"{FIRST_ID + i},{ts:%Y-%m-%d %H:%M:%S},c-{card},m-{merchant},{cents // 100}.{cents % 100:02d}\n"


def main():
    default = pathlib.Path(__file__).with_name("payments.csv")
    target = sys.argv[1] if len(sys.argv) > 1 else str(default)
    text = "".join(rows())
    if target == "-":
        sys.stdout.write(text)
    else:
        pathlib.Path(target).write_text(text)


if __name__ == "__main__":
    main()
