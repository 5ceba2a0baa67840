"""The reproduction suite: every paper's headline claim, one command, a report with plots.

It lives in the repository, not in the ``lightning_fed`` package, because its runs are the YAML files under the
repository's ``configs/`` (also the docs' examples) and its report is the docs' "Reproduction" page's: it runs from
a checkout, via ``python benchmarks/reproduce.py`` from the repository root, or ``lightning-fed reproduce`` once
the checkout's ``benchmarks/`` is installed (``pip install -e benchmarks/``).

* :mod:`~benchmarks.reproduce.experiments`: the runs (YAML files) and how each profile scales them;
* :mod:`~benchmarks.reproduce.claims`: the claims, the papers' figures and the runs each rests on;
* :mod:`~benchmarks.reproduce.measures` and :mod:`~benchmarks.reproduce.rules`: what is measured in a run's
  ``summary.json`` and the verdict rules, fixed before any result;
* :mod:`~benchmarks.reproduce.runner`: parallel ``lightning-fed fit`` runs;
* :mod:`~benchmarks.reproduce.report`, :mod:`~benchmarks.reproduce.figures` and
  :mod:`~benchmarks.reproduce.dashboard`: ``REPRODUCTION.md``, its figures, and the same on W&B;
* :mod:`~benchmarks.reproduce.command`: ``lightning-fed reproduce``.
"""

from benchmarks.reproduce.claims import CLAIMS, Claim
from benchmarks.reproduce.experiments import EXPERIMENTS, PROFILES, Experiment

__all__ = ["CLAIMS", "EXPERIMENTS", "PROFILES", "Claim", "Experiment"]
