"""`cdt report`: train, export and evaluate an algorithm x task x seed grid; write Table 1.

Layout: `config.py` (`ReportConfig`, the grid), `grid.py` (training, export and evaluation of
every cell: it orchestrates baselines/, learn/, export and evaluation/), `tables.py` (pure
rendering of `RunResult`s into the paper's table) and `cli.py` (`main`, the written tables).
"""
