import sys
from pathlib import Path

# The suite is `benchmarks.reproduce`, a package of the repository checkout rather than of the installed library:
# make the checkout importable however pytest was started (`pytest` does not put the working directory on the path).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
