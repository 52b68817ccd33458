"""The ranks of a run on one machine run as workers of torch.distributed's elastic agent: a failing
worker stops the others at once and the run fails naming it; status.json records it."""

import json
import os
import time

import pytest
from creditlab.run.launch import RankFailed, recorded, start_ranks

pytestmark = pytest.mark.slow


def test_a_failing_rank_stops_the_others_and_fails_the_run(tmp_path):
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "CREDITLAB_THREADS")}
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 exited with code 3; the other ranks were stopped"):
        with recorded(tmp_path):
            start_ranks(tmp_path, processes=2, threads=1, module="tests.integration.fail_rank")
    assert time.monotonic() - start < 45, "rank 0 (sleeping 60 s) was not stopped"
    assert sorted(p.name for p in tmp_path.glob("*.started")) == ["rank0.started", "rank1.started"]
    assert (tmp_path / "rank0.started").read_text() == "1", "each worker gets its thread count"
    state = json.loads((tmp_path / "status.json").read_text())
    assert state["status"] == "failed" and state["error"]["type"] == "RankFailed"
    assert {k: os.environ.get(k) for k in env} == env, "the agent's environment is restored"
