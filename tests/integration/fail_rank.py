"""A worker for tests/integration/test_launch.py: rank 1 fails at once, rank 0 would run for a
minute (the agent must stop it). Run as ``python -m tests.integration.fail_rank <dir>``."""

import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    Path(sys.argv[1], f"rank{rank}.started").write_text(os.environ.get("CREDITLAB_THREADS", ""))
    if rank == 1:
        sys.exit(3)
    time.sleep(60)
