"""The estimator phases of the memory plan (creditlab.run.memory_phases) against hand-computed bytes,
their own phase in `creditlab train --dry-run`, and credit-bench's phases.

The model is test_memory_plan's small Qwen2 (fp32: w = a = 4; n = 2 layers, H = 64, I = 128, 2 KV
heads of 16, V = 1000): keys and values 2 x 2 x 2 x 16 x 4 = 512 bytes per token, a no-grad
forward (4H + 3I) x a = 2,560 bytes per token, an autograd forward 10,240 bytes per token
(test_memory_plan's per_token). The step: 2 prompts x 4 rows (R = 8), prompt 10, response 8
(L = 18)."""

from __future__ import annotations

import pytest
from creditlab.cli import main
from creditlab.run.compose import compose
from creditlab.run.config import validate
from creditlab.run.memory import bench_plan, estimate, shape_of
from transformers import Qwen2Config

from tests.helpers import tiny_model_and_tokenizer
from tests.unit.test_memory_plan import QWEN, QWEN_PARAMS, _plan

KV, NO_GRAD, KEPT = 512, 2560, 10240
#: What every estimator phase holds besides its own tensors: weights and AdamW's two moments (fp32).
STATE = QWEN_PARAMS * 4 * 3


def _own(plan, name):
    phase = f"advantage ({name})"
    return plan.phases[phase] - STATE, {k: v for k, v in plan.parts.items() if k.startswith("advantage ")}


def test_oar_p_holds_kv_copies_and_read_logits(tmp_path):
    # chunk_size 64 (the default): c = 64 probes, t = min(64, R) = 8 clean probes' caches and 64 copies
    total, parts = _own(_plan(tmp_path, "advantage=oar_p"), "oar_p")
    assert parts["advantage kv cache"] == (8 + 64) * 18 * KV == 663_552
    assert parts["advantage activations"] == 64 * 18 * NO_GRAD == 2_949_120
    assert parts["advantage logits"] == 64 * 1000 * (4 * 1 + 24) == 1_792_000  # mode last: one read position
    assert total == 663_552 + 2_949_120 + 1_792_000
    # rows per forward (loss.micro_batch_size) bound the copies; chunk_size bounds everything
    micro = _own(_plan(tmp_path, "advantage=oar_p", "loss.micro_batch_size=16"), "oar_p")[1]
    assert micro["advantage kv cache"] == (8 + 16) * 18 * KV and micro["advantage activations"] == 16 * 18 * NO_GRAD
    small = _own(_plan(tmp_path, "advantage=oar_p", "advantage.chunk_size=4"), "oar_p")[1]
    # read logits for a block of 8 chunks (BLOCK_CHUNKS), at most the R x T = 64 perturbed probes
    assert (small["advantage kv cache"], small["advantage logits"]) == ((4 + 4) * 18 * KV, 32 * 1000 * 28)


def test_oar_g_holds_training_activations_for_its_rows(tmp_path):
    # chunk_size 0: every probed row, at most R = 8; answer_mean reads up to 16 answer positions
    total, parts = _own(_plan(tmp_path, "advantage=oar_g"), "oar_g")
    assert parts["advantage activations"] == 8 * 18 * KEPT + 3 * 8 * 18 * 64 * 4 == 1_585_152
    assert parts["advantage logits"] == 8 * 8 * 16 * 1000 == 1_024_000
    assert total == 1_585_152 + 1_024_000
    two = _own(_plan(tmp_path, "advantage=oar_g", "advantage.chunk_size=2"), "oar_g")[1]
    assert two["advantage activations"] == 2 * 18 * KEPT + 3 * 2 * 18 * 64 * 4
    # chunk_size 0 follows the handle: rows per forward, and the update's token budget (rows of L = 18)
    rows = _own(_plan(tmp_path, "advantage=oar_g", "loss.micro_batch_size=3"), "oar_g")[1]
    assert rows["advantage activations"] == 3 * 18 * KEPT + 3 * 3 * 18 * 64 * 4
    tokens = _own(_plan(tmp_path, "advantage=oar_g", "loss.micro_batch_tokens=90"), "oar_g")[1]
    assert tokens["advantage activations"] == 5 * 18 * KEPT + 3 * 5 * 18 * 64 * 4  # 90 // 18 = 5 rows
    assert tokens["advantage logits"] == 8 * 5 * 16 * 1000


def test_rredcot_holds_trunk_caches_and_branch_copies(tmp_path):
    # segmenter whole: 2 states a row at most, G = 4 answers: 8 x 2 x 4 = 64 branches of 16 + 8 tokens
    total, parts = _own(_plan(tmp_path, "advantage=rredcot"), "rredcot")
    assert parts["advantage kv cache"] == 8 * 18 * KV + 64 * (18 + 24) * KV == 1_449_984
    assert parts["advantage activations"] == 8 * 18 * NO_GRAD == 368_640
    assert parts["advantage logits"] == 8 * 64 * 24 * 1000  # V = 1000 < 1024: the full logits
    fused = _own(_plan(tmp_path, "advantage=rredcot", "loss.fused_head=on"), "rredcot")[1]
    assert fused["advantage logits"] == 64 * 24 * 64 * 4 + 12 * 512 * 1000  # hidden states, three tiles
    chunked = _own(_plan(tmp_path, "advantage=rredcot", "advantage.max_rows=16"), "rredcot")[1]
    assert chunked["advantage kv cache"] == 8 * 18 * KV + 16 * 42 * KV


def test_mc_values_generate_their_continuations(tmp_path):
    # one state a row (whole), 4 continuations each: 32 rows decoding from prompt + response (18 tokens)
    total, parts = _own(_plan(tmp_path, "advantage=mc_value"), "mc_value")
    assert parts["advantage generation tensors"] == 32 * 1000 * (4 + 16) + 32 * 18 * NO_GRAD
    assert parts["advantage kv cache"] == 32 * (18 + 8) * KV
    # the thought segmenter with thought-by-thought rollouts: up to max_thoughts states a row
    thoughts = _plan(tmp_path, "advantage=mc_value", "segmenter=thought", "rollout.thoughts=true",
                     "rollout.max_thoughts=3", "rollout.max_thought_tokens=4")
    assert thoughts.dims.segments == 3 and thoughts.dims.T == 12


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "ibpo", "sham_credit"])
def test_plain_estimators_add_no_phase(name, tmp_path):
    plan = _plan(tmp_path, f"advantage={name}")
    assert not any(p.startswith("advantage") for p in plan.phases) and not plan.notes


def test_ibpo_repairs_generate_one_row_each(tmp_path):
    # 8 repairs whose context holds the prompt and two attempts: 10 + 2 x 8 = 26 tokens
    parts = _own(_plan(tmp_path, "advantage=ibpo", "advantage.mode=repair"), "ibpo")[1]
    assert parts["advantage generation tensors"] == 8 * 1000 * 20 + 8 * 26 * NO_GRAD
    assert parts["advantage kv cache"] == 8 * (26 + 8) * KV


def test_dry_run_prints_oar_ps_own_phase(tmp_path, capsys):
    """`--dry-run` with method=oar_p prints an estimator phase GRPO's plan does not have."""
    tiny_model_and_tokenizer(tmp_path / "model")
    main(["train", "--dry-run", f"model.name_or_path={tmp_path / 'model'}", "method=oar_p", "--prompt-tokens", "20"])
    oar = capsys.readouterr().out
    main(["train", "--dry-run", f"model.name_or_path={tmp_path / 'model'}", "method=grpo", "--prompt-tokens", "20"])
    grpo = capsys.readouterr().out
    assert "advantage (oar_p)" in oar and "advantage kv cache" in oar and "advantage logits" in oar
    assert "advantage (" not in grpo and "advantage kv cache" not in grpo


def test_credit_bench_runs_each_estimator_on_every_chain(tmp_path):
    """3 prompts x G = 4: R = 12 chains at once, beside the weights only; the handle's rows per
    forward are the run's step (2 x 4 = 8), OAR-G's gradient calls included; the truth decodes 512
    continuations a call (256 a batch)."""
    Qwen2Config(**QWEN).save_pretrained(tmp_path)
    base = [f"model.name_or_path={tmp_path}", "prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=8", "rollout.temperature=1.0", "eval.every=0"]
    cfg = compose(base)
    checked = validate(cfg)
    sections = {name: validate(compose([*base, f"advantage={name}"]))["advantage"][1] for name in ("oar_g", "oar_p", "grpo")}
    phases, notes = bench_plan(cfg, checked, shape_of(Qwen2Config(**QWEN)), 10, 3,
                               {n: (c, "whole", None) for n, c in sections.items()})
    weights = QWEN_PARAMS * 4
    assert phases["credit-bench oar_g"] - weights == 8 * 18 * KEPT + 3 * 8 * 18 * 64 * 4 + 8 * 8 * 16 * 1000
    assert phases["credit-bench oar_p"] - weights == (12 + 8) * 18 * KV + 8 * 18 * NO_GRAD + 96 * 1000 * 28
    assert phases["credit-bench truth"] - weights == 256 * 1000 * 20 + 256 * 18 * NO_GRAD + 256 * 26 * KV
    assert "credit-bench grpo" not in phases and not notes
    # the bench's OAR-G holds what it holds in training: the step's 8 rows a gradient call
    train = estimate(compose([*base, "advantage=oar_g"]), validate(compose([*base, "advantage=oar_g"])),
                     shape_of(Qwen2Config(**QWEN)), 10, 10, 8)
    assert train.phases["advantage (oar_g)"] - STATE == phases["credit-bench oar_g"] - weights


def test_credit_bench_dry_run_prints_its_phases(tmp_path, capsys, monkeypatch):
    """`creditlab credit-bench --dry-run`: the bench's phases without loading the model or writing a report."""
    tiny_model_and_tokenizer(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    main(["credit-bench", "--dry-run", "--prompts", "3", "--estimators", "oar_g,grpo", "--selectors", "random",
          f"model.name_or_path={tmp_path / 'model'}", "rollout.group_size=4"])
    out = capsys.readouterr().out
    assert "3 prompts x 4 chains" in out and "credit-bench truth" in out and "credit-bench oar_g" in out
    assert "credit-bench grpo" not in out and "an upper bound" in out
    assert not (tmp_path / "credit-bench").exists()  # the default --out, in the working folder


def test_a_plugins_estimator_states_its_memory_or_is_named_as_not_modeled(tmp_path):
    """A plug-in estimator registers ``(config, step) -> {component: bytes}`` in group
    ``creditlab.advantage_memory``; without it the plan says it is not modeled."""
    from creditlab.registry import REGISTRIES
    from creditlab.run.memory_phases import estimator_parts
    from creditlab_grpo.advantage import GRPOAdvantage

    dims = _plan(tmp_path).dims
    REGISTRIES["advantage"].register("probe_everything")(GRPOAdvantage)
    try:
        assert estimator_parts("probe_everything", None, dims) is None
        REGISTRIES["advantage_memory"].register("probe_everything")(
            lambda config, step: {"advantage kv cache": step.rows * (step.prompt + step.T) * step.kv})
        assert estimator_parts("probe_everything", None, dims) == {"advantage kv cache": 8 * 18 * KV}
    finally:
        REGISTRIES["advantage"].unregister("probe_everything")
        REGISTRIES["advantage_memory"].unregister("probe_everything")
    assert estimator_parts("grpo", None, dims) == {}  # a built-in without an entry: nothing beyond the batch


def test_credit_bench_warns_before_the_model_loads_when_its_upper_bound_does_not_fit(tmp_path, monkeypatch):
    """A bench whose plan is over this machine's usable memory says so, with what shrinks it,
    before anything loads (a real-model bench was killed for memory 37 minutes in, with no word);
    one that fits says nothing."""
    from creditlab.cli import credit_bench_command as cmd
    from creditlab.creditbench import Bench, BenchSettings

    tiny_model_and_tokenizer(tmp_path / "model")
    bench = Bench([f"model.name_or_path={tmp_path / 'model'}", "rollout.group_size=4"],
                  BenchSettings(prompts=3, k=4, estimators=("grpo",), selectors=("random",)))
    monkeypatch.setattr(cmd, "available_memory", lambda accelerator: (2.0**20, "a test's 1 MiB"))
    warning = cmd.memory_warning(bench)
    assert warning is not None and "credit-bench truth" in warning and "--dry-run" in warning
    assert "rollout.max_thoughts" in warning and "--prompts" in warning
    monkeypatch.setattr(cmd, "available_memory", lambda accelerator: (2.0**50, "a test's 1 PiB"))
    assert cmd.memory_warning(bench) is None
    monkeypatch.setattr(cmd, "available_memory", lambda accelerator: None)
    assert cmd.memory_warning(bench) is None  # unknown memory: nothing to compare with
