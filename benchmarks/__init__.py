"""The repository's benchmarks and reproduction suite; not part of the installed ``lightning_fed`` package.

The scripts here run from a repository checkout (``python benchmarks/speed.py``); the package makes
:mod:`benchmarks.reproduce` importable from the repository root, which is how ``lightning-fed reproduce`` finds it.
"""
