"""The repository's benchmarks and reproduction suite; not part of the installed ``lightning_fed`` package.

The scripts here run from a repository checkout (``python benchmarks/speed.py``). ``pip install -e benchmarks/``
installs this folder as the distribution ``lightning-fed-benchmarks`` (``benchmarks/pyproject.toml``), which adds
``lightning-fed reproduce`` (through the ``lightning_fed.commands`` entry-point group) and ``lightning-fed-reproduce``.
"""
