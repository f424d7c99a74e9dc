"""Accuracy of the PE's transcendental functions against float64.

For each function of ``wse.firmware.training.transcendental.ACCURACY``
(``exp``, ``reciprocal``, ``rsqrt``, ``tanh``, ``erf``: each built from the
PE's binary32 operations only) prints one JSON line: the range measured,
the number of distinct binary32 points, the largest error in ulps from the
correctly rounded value, the fraction correctly rounded, the worst point and
the bound that ``docs/transformer.md`` documents and the tests check.

    .venv/bin/python bench/transcendental.py [--points 400001]
"""

from __future__ import annotations

import argparse
import json

from wse.firmware.training.transcendental import ACCURACY, measure


def main() -> None:
    """Print one JSON line per function."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=400_001, help="points per function (default 400001)")
    args = parser.parse_args()
    for name in ACCURACY:
        print(json.dumps(measure(name, args.points)), flush=True)


if __name__ == "__main__":
    main()
