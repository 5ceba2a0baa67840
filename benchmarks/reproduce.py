"""Reproduce the papers' headline claims and write REPRODUCTION.md with plots; the same as `lightning-fed reproduce`.

Usage (from the repository root)::

    python benchmarks/reproduce.py --profile small        # every claim, ~1 h on 2 cores
    python benchmarks/reproduce.py --profile smoke        # the whole pipeline in well under a minute
    python benchmarks/reproduce.py --help

See ``benchmarks/reproduce/`` for the runs, the claims and their verdict rules.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, Python puts benchmarks/ on the path; the suite is imported as a package of the checkout.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.reproduce.command import main

    sys.exit(main(sys.argv[1:]))
