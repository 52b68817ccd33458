"""Analysing runs: reading run directories (:mod:`~creditlab.analysis.rundirs`), per-problem
records, statistics and significance tests, pre-registered comparisons, equal-budget reads, learning
curves, a run's headline, and ``creditlab compare`` with its report."""
