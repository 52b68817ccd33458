"""Bad input, caught before the model loads (issue 13, item 4): every case ends with exit code 2 and
one or two lines naming the key, the value and what is allowed, with no traceback, and nothing of
a run is written.

The command-line cases run ``creditlab train`` in this process (``creditlab.cli.main``) with the
training stack replaced by a stub that fails the test if it is ever reached, so "before the model
loads" is checked directly. Cases that need a loaded tokenizer (the over-long row) or a real step
(the no-answer warning) are ``slow`` and run the command in a subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from creditlab.cli import main
from creditlab.cli.plugins_command import plugins
from creditlab.errors import InputError
from creditlab.registry import AUTOLOAD_ENV, REGISTRIES
from creditlab.run.config import RANGES
from creditlab.run.datamodule import TaskDataModule, check_lengths
from creditlab.types import Completion, Problem, Trajectory

from tests.helpers import char_tokenizer, write_dist
from tests.integration.conftest import SMALL


@pytest.fixture
def train(monkeypatch, capsys, tmp_path):
    """``train(*overrides) -> stderr`` of ``creditlab train``, which must exit 2 before training."""
    stub = types.ModuleType("creditlab.run.hydra_main")

    def reached() -> None:
        raise AssertionError("the overrides passed the checks: training (and the model load) started")

    stub.main = reached
    monkeypatch.setitem(sys.modules, "creditlab.run.hydra_main", stub)
    run_dir = tmp_path / "run"

    def run(*overrides: str) -> str:
        with pytest.raises(SystemExit) as exc:
            main(["train", *overrides, f"run_dir={run_dir}"])
        err = capsys.readouterr().err
        assert exc.value.code == 2, err
        assert "Traceback" not in err and 1 <= err.strip().count("\n") + 1 <= 2, err
        assert not run_dir.exists(), "nothing of the run may be written"
        return err

    return run


#: (overrides, text the message must contain): the issue's cases first, then one per range kind.
CASES = [
    (["rollout.temperature=-1"], ["rollout.temperature=-1", "a finite number >= 0"]),
    (["rollout.top_p=2"], ["rollout.top_p=2", "in (0, 1]"]),
    (["optim.lr=nan"], ["optim.lr=nan", "a finite number > 0"]),
    (["optim.lr=-1e-5"], ["optim.lr=-1e-05", "a finite number > 0"]),
    (["optim.lr=abc"], ["optim.lr='abc'", "a finite number > 0"]),
    (["trainer.max_steps=-1"], ["trainer.max_steps=-1", "an integer >= 1"]),
    (["trainer.max_steps=0"], ["trainer.max_steps=0", "an integer >= 1"]),
    (["trainer.max_steps=abc"], ["trainer.max_steps='abc'", "an integer >= 1"]),
    (["rollout.max_new_tokens=0"], ["rollout.max_new_tokens=0", "an integer >= 1"]),
    (["method=dr_grpo", "rollout.max_new_tokens=0"], ["rollout.max_new_tokens=0", "an integer >= 1"]),
    (["rollout.max_new_tokens=1.5"], ["rollout.max_new_tokens=1.5", "an integer >= 1"]),
    (["rollout.group_size=0"], ["rollout.group_size=0", "an integer >= 1"]),
    (["rollout.top_k=-1"], ["rollout.top_k=-1", "an integer >= 0"]),
    (["rollout.thoughts=true", "rollout.max_thoughts=0"], ["rollout.max_thoughts=0", ">= 1"]),
    (["rollout.success_reward=inf"], ["rollout.success_reward=inf", "a finite number"]),
    (["seed=-1"], ["seed=-1", "an integer in [0, 4294967295]"]),
    (["prompts_per_step=0"], ["prompts_per_step=0", "an integer >= 1"]),
    (["grad_clip=-1"], ["grad_clip=-1", ">= 0"]),
    (["checkpoint_every=-2"], ["checkpoint_every=-2", ">= 0"]),
    (["threads=-1"], ["threads=-1", ">= 0"]),
    (["optim.weight_decay=-0.1"], ["optim.weight_decay=-0.1", ">= 0"]),
    (["optim.betas=[0.9,1.5]"], ["optim.betas=[0.9, 1.5]", "a list of 2 finite numbers in [0, 1)"]),
    (["eval.every=-1"], ["eval.every=-1", ">= 0"]),
    (["eval.k=0"], ["eval.k=0", "an integer >= 1"]),
    (["eval.k=1"], ["eval.k=1", "eval/sample_accuracy", "eval.k >= 2"]),
    (["run_dir=/tmp/a=b"], ["'run_dir=/tmp/a=b'", "must be quoted", "run_dir='/tmp/a=b'"]),
    (["eval.temperature=-0.5"], ["eval.temperature=-0.5", ">= 0"]),
    (["eval.batch_size=0"], ["eval.batch_size=0", "an integer >= 1"]),
    (["trainer=ddp", "trainer.num_nodes=0"], ["trainer.num_nodes=0", "an integer >= 1"]),
    (["trainer.log_every_n_steps=0"], ["trainer.log_every_n_steps=0", ">= 1"]),
    (["trainer.precision=bf17"], ["trainer.precision='bf17'", "bf16-mixed", "Did you mean 'bf16'"]),
    (["trainer.accelerator=gpus"], ["trainer.accelerator='gpus'", "cpu, gpu"]),
    (["backend.max_batch_size=0"], ["backend.max_batch_size=0", "an integer >= 1"]),
    (["+backend.compact_fraction=1.5"], ["backend.compact_fraction=1.5", "in [0, 1]"]),
    (["backend=vllm", "backend.gpu_memory_utilization=0"], ["backend.gpu_memory_utilization=0", "in (0, 1]"]),
    (["loss.clip_eps_low=2"], ["clip_eps_low", "[0, 1)", "2.0"]),
    # a verifier's hard time limit per completion (the bombs themselves: tests/unit/test_verifier_bounds.py)
    (["verifier.timeout_s=0"], ["verifier.timeout_s must be > 0", "got 0"]),
    (["task=gsm8k", "verifier.timeout_s=-1"], ["verifier.timeout_s must be > 0", "got -1"]),
    (["task=math", "verifier.timeout_s=inf"], ["verifier.timeout_s must be > 0", "got inf"]),
    (["verifier.workers=0"], ["verifier.workers must be >= 1", "got 0"]),
]


@pytest.mark.parametrize("overrides,expected", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_value_stops_before_the_model_loads(train, overrides, expected):
    err = train(*overrides)
    for text in expected:
        assert text in err, err
    assert "norm_constant" not in err  # a zero budget is named as such, not as Dr. GRPO's constant


def test_every_range_is_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [key for key in RANGES if f"`{key}`" not in doc]
    assert not missing, f"docs/configuration.md lists no range for {missing}"


def test_gpu_trainer_without_a_gpu_names_what_to_use(train):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    err = train("trainer=gpu")
    assert "trainer.accelerator=gpu needs a CUDA GPU" in err and "trainer=cpu" in err and "trainer=ddp" in err


def test_too_many_gpus_names_the_count(train, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    err = train("trainer=ddp_gpu", "trainer.devices=4")
    assert "trainer.devices=4 asks for 4 GPUs, but this machine has 1: set trainer.devices=1" in err


def test_a_task_brings_its_verifier_and_an_explicit_one_wins():
    from creditlab.run.compose import compose

    pairs = {"arith": "arith", "gsm8k": "gsm8k", "math": "math_verify",
             "numina_olympiads": "math_verify", "code": "code_tests"}
    for task, verifier in pairs.items():
        assert compose([f"task={task}"]).verifier.name == verifier, task
    assert compose(["task=gsm8k", "verifier=math_verify"]).verifier.name == "math_verify"
    assert compose(["verifier=math_verify", "task=gsm8k"]).verifier.name == "math_verify"
    assert compose([]).verifier.name == "arith"


# -- plug-ins ------------------------------------------------------------------------------------
@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on ``sys.path`` with a plug-in that fails to import and one that imports but ships
    no config file (neither has a YAML)."""
    root = tmp_path / "site"
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    write_dist(root, "broken-plugin", {"creditlab.advantage": {"broken": "cl_bad_input_broken:Thing"}},
               {"cl_bad_input_broken.py": "import creditlab_no_such_dependency\n"})
    write_dist(root, "bare-plugin", {"creditlab.advantage": {"bare": "creditlab_grpo.advantage:GRPOAdvantage"}})
    for reg in REGISTRIES.values():
        reg.refresh()
    yield root
    sys.modules.pop("cl_bad_input_broken", None)
    for reg in REGISTRIES.values():
        reg.refresh()


def test_broken_plugin_shows_its_import_error(train, site):
    err = train("advantage=broken")
    assert "unknown" not in err and "'broken-plugin'" in err
    assert "ModuleNotFoundError" in err and "creditlab_no_such_dependency" in err


def test_plugin_without_a_config_file_says_so(train, site):
    err = train("advantage=bare")
    assert "registered by 'bare-plugin'" in err and "advantage/bare.yaml" in err


def test_plugins_lists_the_import_error_in_the_row(site, capsys):
    plugins([])
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if " broken " in line)
    assert "broken-plugin" in row and "ModuleNotFoundError" in row
    assert next(line for line in out.splitlines() if " grpo " in line).rstrip(" │").endswith("ok")
    assert "advantage 'broken' from 'broken-plugin'" in err and "creditlab_no_such_dependency" in err


# -- data rows -----------------------------------------------------------------------------------
class _Task:
    """A stand-in task: ``rows[split]`` prompts."""

    def __init__(self, rows: dict[str, list[str]]) -> None:
        self.rows = rows

    def load(self, split: str) -> list[Problem]:
        return [Problem(f"{split}-{i}", p, "1") for i, p in enumerate(self.rows[split])]


def test_an_over_long_row_is_named_at_start_up():
    tok = char_tokenizer()
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=100))
    from creditlab.types import RolloutConfig

    rows = {"train": ["1+1="] * 5 + ["9" * 90] + ["2+2="] * 5 + ["8" * 95], "test": ["3+3="]}
    data = TaskDataModule(_Task(rows), 4, 3, 0)
    with pytest.raises(InputError) as exc:
        data.check_rows(tok, model, RolloutConfig(max_new_tokens=16))
    msg = str(exc.value)
    assert "split 'train', row 5 (id 'train-5')" in msg and "90 tokens + rollout.max_new_tokens=16" in msg
    assert "context of 100" in msg and "1 more rows too long, e.g. ids 'train-11'" in msg
    data.check_rows(tok, model, RolloutConfig(max_new_tokens=5))  # 95 + 5 fits exactly
    thoughts = RolloutConfig(thoughts=True, max_thought_tokens=4, max_new_tokens=64)
    data.check_rows(tok, model, thoughts)  # one thought's budget per generation call
    check_lengths(data.train_problems, lambda t: tok.encode(t), 10**6, None, "no context")  # no limit


def test_first_step_without_a_parsable_answer_warns(caplog):
    from creditlab.step.evaluation import EvalConfig
    from creditlab.step.losses import LossConfig
    from creditlab.step.module import CreditAssignmentModule
    from creditlab.types import RolloutConfig

    from tests.helpers import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    module = CreditAssignmentModule(model, tok, None, None, [], LossConfig(), RolloutConfig(), EvalConfig(every=0),
                                    None, seed=0, names={"task": "gsm8k", "verifier": "arith"})

    def trajs(*parsed):
        c = Completion((2,), (5,), (0.0,), "length", "x")
        return [Trajectory(Problem("p", "q", "1"), c, 0.0, 0, info={"parsed": p, "truncated": True}) for p in parsed]

    with caplog.at_level(logging.WARNING, logger="creditlab.step.step_metrics"):
        assert not module.warn_if_no_answers(trajs(None, "3"))
        assert not caplog.records
        assert module.warn_if_no_answers(trajs(None, None))
    [record] = caplog.records
    text = record.getMessage()
    assert "verifier=arith, task=gsm8k: 0 of 2" in text and "2 of 2 cut off" in text and "verifier=" in text


# -- the same, end to end (slow: real processes with the tiny model) -------------------------------
def _cli(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "creditlab.cli", "train", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def _small(run_dir: Path, *extra: str) -> list[str]:
    return [*(o for o in SMALL if not o.startswith(("eval.every", "task."))), "eval.every=0",
            f"run_dir={run_dir}", *extra]


@pytest.mark.slow
def test_cli_over_long_row_stops_before_training(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(12)]
    rows[7] = {"question": "Tell me " + "very " * 500 + "much.", "answer": "#### 1"}
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    out = _cli(_small(tmp_path / "run", "task=gsm8k", f"task.path={data}", "trainer.max_steps=3"))
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "split 'train', row 7 (id 'gsm8k-train-7')" in out.stderr and "context of" in out.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_cli_optim_nan_in_a_real_process(tmp_path):
    out = _cli(["optim.lr=nan", f"run_dir={tmp_path / 'run'}"], timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "optim.lr=nan: must be a finite number > 0." in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_first_step_without_answers_warns(tmp_path):
    out = _cli(_small(tmp_path / "run", "rollout.max_new_tokens=2", "trainer.max_steps=1"))
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "no completion of the first step has an answer the verifier can parse" in text
    assert "verifier=arith, task=arith" in text
