"""``creditlab credit-bench``: score advantage estimators and reset selectors against a Monte-Carlo
ground truth, without training (docs/credit-bench.md)."""

from creditlab.creditbench.bench import Bench, BenchError, BenchSettings
from creditlab.creditbench.report import print_table, write_report
from creditlab.creditbench.result import BenchResult

__all__ = ["Bench", "BenchError", "BenchResult", "BenchSettings", "print_table", "write_report"]
