"""Unit tests for the ``arith_tiny`` model recipe: its warm start, its supervised problems and the
localization examples (split from tests/unit/test_arith.py)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from creditlab_arith.task import ArithTask  # noqa: E402
from creditlab_arith.tokenizer import build_char_tokenizer  # noqa: E402

from tests.unit.test_arith import small_task  # noqa: E402


# -- model recipe ------------------------------------------------------------------------------
def test_recipe_builds_loadable_checkpoint_and_caches(tmp_path, monkeypatch, capsys) -> None:
    import creditlab_arith.model as recipe
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("CREDITLAB_CACHE", str(tmp_path))
    args = {"steps": 3, "batch_size": 4, "layers": 1, "hidden_size": 32, "heads": 2,
            "intermediate_size": 64, "task": {"num_train": 16, "num_test": 4}}
    path = recipe.build_tiny_model(args)
    assert path.startswith(str(tmp_path / "models" / "arith_tiny-"))
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    text = "7+5=12</thought>12*3=\\boxed{36}</thought>"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    assert tok.pad_token_id != tok.eos_token_id
    assert model.config.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok("Start 7, +5. ")["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                         do_sample=False)
    assert out.shape == (1, ids.shape[1] + 3) or out[0, -1] == tok.eos_token_id

    def no_training(*a: object, **k: object) -> None:
        raise AssertionError("cache miss: the recipe trained again")

    monkeypatch.setattr(recipe, "_train", no_training)
    assert recipe.build_tiny_model(dict(args)) == path
    with pytest.raises(ValueError, match="unknown"):
        recipe.build_tiny_model({"stepz": 3})
    with pytest.raises(ValueError, match="task option"):
        recipe.build_tiny_model({"task": {"num_trian": 3}})


def test_recipe_entry_point() -> None:
    import creditlab_arith.model as recipe
    from creditlab.registry import registry

    assert registry("model_recipe").get("arith_tiny") is recipe.build_tiny_model
    assert recipe.checkpoint_dir({}) == recipe.checkpoint_dir({"seed": 0, "task": {"seed": 0}})
    assert recipe.checkpoint_dir({}) != recipe.checkpoint_dir({"seed": 1})


def test_task_options_added_later_keep_the_cache_keys_at_their_default() -> None:
    """A task option added to ArithTask.Config (``render``) leaves every existing cache key as it
    was at its default, so no user's cached warm start is rebuilt; the demo's key is pinned."""
    import creditlab_arith.model as recipe
    from creditlab_smollm2 import sft

    assert recipe.checkpoint_dir({"stop_at_pass1": 0.5}).name == "arith_tiny-723602926adc"  # model=tiny
    assert sft.checkpoint_dir({"stop_at_pass1": 0.3}).name == "smollm2_135m_sft-7f8c06de1704"
    assert recipe.checkpoint_dir({}) == recipe.checkpoint_dir({"task": {"render": "symbolic"}})
    assert recipe.checkpoint_dir({}) != recipe.checkpoint_dir({"task": {"render": "words"}})


def test_stop_at_pass1_arguments_and_cache_identity() -> None:
    """``stop_at_pass1`` is checked; unset, it and its two companions leave the cache key of the
    recipe as it was (existing warm starts stay valid); set, it makes a new one."""
    import creditlab_arith.model as recipe

    base = recipe.checkpoint_dir({})
    assert recipe.checkpoint_dir({"stop_at_pass1": None, "validate_every": 7}) == base
    stopped = recipe.checkpoint_dir({"stop_at_pass1": 0.5})
    assert stopped != base and stopped != recipe.checkpoint_dir({"stop_at_pass1": 0.6})
    assert recipe.checkpoint_dir({"stop_at_pass1": 0.5, "validate_every": 7}) != stopped
    for bad in ({"stop_at_pass1": 1.5}, {"stop_at_pass1": 0}, {"stop_at_pass1": "high"},
                {"validate_every": 0}, {"validation_problems": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            recipe.resolve_args(bad)


def test_warm_start_stops_at_the_first_check_that_reaches_the_target(capsys) -> None:
    """Checks every ``validate_every`` steps, 4x as far apart while below half the target; the
    first check at or above the target ends training there and is recorded."""
    import creditlab_arith.model as recipe
    import torch
    from creditlab_arith import sft_loop
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    data = [([1, 5, 6, 7, 2], 2, 1.0), ([1, 8, 9, 2], 1, 1.0)] * 4
    args = {**recipe.resolve_args({"steps": 100, "batch_size": 4, "stop_at_pass1": 0.5,
                                   "validate_every": 5}), "lr": 1e-3}
    scores = iter([0.1, 0.3, 0.45, 0.6, 0.9])
    seen: list[bool] = []

    def validate() -> float:
        seen.append(model.training)
        return next(scores)

    info = sft_loop.warm_start(model, data, 0, args, validate)
    # 5: 0.1 < 0.25 -> next at 5 + 20; 25: 0.3 -> next at 30; 30: 0.45 -> 35; 35: 0.6 >= 0.5, stop
    assert info["validation"] == [(5, 0.1), (25, 0.3), (30, 0.45), (35, 0.6)]
    assert info["steps_run"] == 35 and seen == [True] * 4 and not model.training
    assert "stopped at held-out greedy pass@1 0.600 >= 0.5" in capsys.readouterr().out
    never = sft_loop.warm_start(model, data, 0, {**args, "steps": 12}, lambda: 0.3)
    assert never["steps_run"] == 12 and never["validation"] == [(5, 0.3), (10, 0.3)]
    assert "never reached 0.5" in capsys.readouterr().out
    assert "validation" not in sft_loop.warm_start(model, data, 0, {**args, "steps": 2})
    assert torch.isfinite(torch.tensor(info["final_loss"]))


def test_greedy_pass1_checks_answers_as_the_verifier() -> None:
    """The warm start's validation score: greedy generations checked like the ``arith`` verifier
    (last box, integer), with the model's mode and the tokenizer's padding side restored."""
    import creditlab_arith.model as recipe
    import torch

    tok = build_char_tokenizer()
    task = small_task()
    problems = task.load("test")[:3]
    replies = ["1+1=\\boxed{" + problems[0].answer + "}</thought>", "no box", "\\boxed{-1}"]

    class Scripted(torch.nn.Module):
        """Answers problem i with replies[i] after its (left-padded) prompt."""

        def generate(self, input_ids, attention_mask, **kw):
            assert kw["do_sample"] is False and tok.padding_side == "left"
            assert bool((attention_mask[:, -1] == 1).all())  # left padding
            rows = [tok(r, add_special_tokens=False)["input_ids"] for r in replies[: len(input_ids)]]
            width = max(map(len, rows))
            tail = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
            return torch.cat([input_ids, tail], dim=1)

    model = Scripted().train()
    tok.padding_side = "right"
    assert recipe.greedy_pass1(model, tok, problems) == pytest.approx(1 / 3)
    assert model.training and tok.padding_side == "right"


def test_supervised_problems_are_fresh_and_disjoint_from_the_task() -> None:
    """The warm start never sees a problem of the task's train or test split (RL and held-out
    evaluation run on problems it did not fit), and draws them deterministically."""
    from creditlab_arith.model import sft_problems

    task = small_task()
    taken = {p.prompt for split in ("train", "test") for p in task.load(split)}
    first = sft_problems(task, 200)
    assert len(first) == len({p.prompt for p in first}) == 200
    assert not taken & {p.prompt for p in first}
    assert [p.prompt for p in sft_problems(task, 200)] == [p.prompt for p in first]
    with pytest.raises(ValueError, match="lower sft_problems"):
        sft_problems(small_task(num_train=2, num_test=1, min_steps=1, max_steps=1, max_operand=2, ops="+"), 50)


def test_localization_examples_blame_the_corrupted_step() -> None:
    """The warm start's localization data: step k is the oracle's first wrong thought, the final
    answer is wrong, and the answer text is what the SRPO parser reads as k + 1."""
    import random

    from creditlab_arith.localization import corrupted_thoughts, worked_localization
    from creditlab_arith.model import _examples, sft_problems
    from creditlab_arith.task import last_boxed
    from creditlab_resets.localize import parse_localization

    task = small_task()
    rng = random.Random(0)
    for p in task.load("train")[:100]:
        n = len(p.metadata["steps"])
        for k in range(n):
            thoughts = corrupted_thoughts(p, k, rng, task.config.max_operand)
            assert len(thoughts) == n and p.oracle(thoughts) == k
            assert last_boxed(thoughts[-1]) != p.answer
            worked = worked_localization(p, thoughts)  # re-does steps 1..k+1, boxes k+1
            assert parse_localization(worked, n) == (k + 1, "boxed")
            assert worked.count(" ok") == k and worked.count(" no ") == 1
    tok = build_char_tokenizer()
    data = _examples(task, tok, 0.5, seed=0, problems=sft_problems(task, 300))
    assert len(data) == 300 + 150
    ids, n_prompt, weight = data[-1]
    assert {w for *_, w in data} == {1.0}  # unweighted by default
    weighted = _examples(task, tok, 0.5, seed=0, problems=sft_problems(task, 300), localization_weight=20.0)
    assert [w for *_, w in weighted] == [1.0] * 300 + [20.0] * 150  # solutions, then localization
    assert [r[:2] for r in weighted] == [r[:2] for r in data]
    prompt, answer = tok.decode(ids[:n_prompt]), tok.decode(ids[n_prompt:], skip_special_tokens=True)
    assert prompt.startswith("<s>Check: Start ") and prompt.endswith("First wrong step:")
    n = prompt.count("\nStep ")
    assert 1 <= parse_localization(answer, n)[0] <= n and parse_localization(answer, n)[1] == "boxed"


@pytest.mark.numerics
def test_warm_start_split_passes_equal_one_padded_pass() -> None:
    """The warm start runs a batch as length groups; loss and gradient equal the padded batch's
    token-mean loss (HF's own loss over one padded pass)."""
    import torch
    from creditlab_arith import sft_loop
    from transformers import LlamaConfig, LlamaForCausalLM

    rows = [([1, 5, 6, 7, 8, 2], 2, 1.0), ([1, 5, 6, 2], 3, 1.0)] * 3 + [([1] + list(range(5, 25)) + [2], 15, 1.0)] * 2
    parts = sft_loop.split_by_length(rows)
    assert [len(p) for p in parts] == [6, 2]  # short rows, then the long ones
    assert sft_loop.split_by_length(rows[:6]) == [sorted(rows[:6], key=lambda r: len(r[0]))]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2))
    ids, mask, labels = sft_loop._batch(rows, 0)
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    n_target = sum(len(r) - n for r, n, _ in rows)
    for part in parts:
        ids, mask, labels = sft_loop._batch(part, 0)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 32), labels[:, 1:].reshape(-1), reduction="sum")
        (loss / n_target).backward()
    from tests.numerics import assert_close_fp, lm_length

    n = lm_length(model.config, max(len(r) for r, _, _ in rows), backward=True, tokens=sum(len(r) for r, _, _ in rows))
    for a, p in zip(want, model.parameters()):  # two passes against one: other sums
        assert_close_fp(p.grad, a, length=n)


def test_worked_localization_ignores_numbering_and_builds_examples() -> None:
    """``worked`` answers ignore a thought's ``i:`` numbering; the recipe builds them on request."""
    import random

    from creditlab_arith.localization import corrupted_thoughts, worked_localization
    from creditlab_arith.model import _examples, sft_problems

    task = small_task()
    rng = random.Random(1)
    p = task.load("train")[0]
    assert worked_localization(p, ["1:" + t for t in corrupted_thoughts(p, 0, rng, 12)]).endswith("\\boxed{1}")
    tok = build_char_tokenizer()
    data = _examples(task, tok, 0.5, seed=0, problems=sft_problems(task, 40), localization_answer="worked")
    ids, n_prompt, _ = data[-1]
    assert " ok" in tok.decode(ids[n_prompt:]) or " no " in tok.decode(ids[n_prompt:])


def test_resolve_localization_by_hand() -> None:
    """``resolve`` answers re-solve every step from the problem and compare results only (a wrong
    operand with the right result is ``ok``); the first ``no`` is boxed."""
    from creditlab_arith.localization import resolved_localization
    from creditlab_resets.localize import parse_localization

    p = ArithTask().make_problem("x", 7, [("*", 12, 84), ("+", 9, 93), ("-", 10, 83), ("*", 2, 166)])
    chain = ["7*12=84</thought>", "84+9=89</thought>", "89-10=79", "79*2=\\boxed{158}"]
    want = " 1) 7*12=84 84 ok 2) 84+9=93 89 no 3) 93-10=83 79 no 4) 83*2=166 158 no \\boxed{2}"
    assert resolved_localization(p, chain) == want
    assert parse_localization(want, 4) == (2, "boxed")
    numbered = ["1:7*12=84", "2:84+9=93", "3:93-10=83", "4:83*2=\\boxed{160}"]
    assert resolved_localization(p, numbered).endswith("4) 83*2=166 160 no \\boxed{4}")
    # same result through a wrong operand counts as ok; a missing or malformed thought is no
    assert resolved_localization(p, ["7*12=84", "84+9=93", "90-7=83", "junk"]).endswith("83 ok 4) 83*2=166 ? no \\boxed{4}")
    assert resolved_localization(p, ["7*12=84"]) == " 1) 7*12=84 84 ok 2) 84+9=93 ? no 3) 93-10=83 ? no 4) 83*2=166 ? no \\boxed{2}"
    assert resolved_localization(p, ["7*12=84", "84+9=93", "93-10=83", "83*2=\\boxed{166}"]).endswith("\\boxed{4}")


def test_resolve_examples_blame_step_k() -> None:
    """The ``resolve`` chains (consistent wrong results, or scattered ones) have their first wrong
    thought at k, and their answers box k + 1 with one verdict per step."""
    import random

    from creditlab_arith.localization import (
        corrupted_thoughts,
        localization_example,
        scattered_thoughts,
    )
    from creditlab_resets.localize import parse_localization

    task = small_task()
    rng = random.Random(0)
    kinds = set()
    for p in task.load("train")[:60]:
        steps, n = p.metadata["steps"], len(p.metadata["steps"])
        for k in range(n):
            for thoughts in (scattered_thoughts(p, k, rng), corrupted_thoughts(p, k, rng, 12, operand_errors=False)):
                assert p.oracle(thoughts) == k
                assert thoughts[:k] == p.metadata["thoughts"][:k]
                value = p.metadata["values"][k]
                assert thoughts[k].startswith(f"{value}{steps[k][0]}{steps[k][1]}=")  # only the result is wrong
        thoughts, answer = localization_example(p, rng, "resolve", 12)
        k = p.oracle(thoughts)
        kinds.add(all(t.startswith(f"{v}") for t, v in zip(thoughts, p.metadata["values"])))
        assert parse_localization(answer, n) == (k + 1, "boxed")
        assert answer.count(" ok") + answer.count(" no") == n and answer.count(" ok") >= k
    assert kinds == {True, False}  # both chain kinds occur
    with pytest.raises(ValueError, match=r"localization_answer must be one of \['boxed', 'worked', 'resolve'\]"):
        localization_example(p, rng, "verdicts", 12)
    from creditlab_arith.model import resolve_args

    with pytest.raises(ValueError, match="localization_answer must be one of"):
        resolve_args({"localization_answer": "Resolve"})


@pytest.mark.numerics
@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (1.0, 20.0, 0.5)])
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft -> transformers
def test_head_on_targets_gives_the_full_heads_loss_and_gradient(weights) -> None:
    """The warm start's output layer on the target positions only (``head_on_targets``) gives the
    loss and gradients of the full head, weighted rows included, through a PEFT wrapper."""
    import torch
    from creditlab_arith import sft_loop
    from peft import LoraConfig, get_peft_model
    from tests.numerics import assert_close_fp, lm_length
    from transformers import LlamaConfig, LlamaForCausalLM

    rows = [([1, 5, 6, 7, 8, 2], 2, weights[0]), ([1, 5, 6, 2], 3, weights[1]), ([1, 9, 9, 9, 7, 6, 5, 2], 4, weights[2])]
    torch.manual_seed(0)
    model = get_peft_model(
        LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2)),
        LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
    losses, grads = [], []
    for head_on_targets in (False, True):
        model.zero_grad()
        loss = sft_loop._summed_loss(model, rows, 0, head_on_targets)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    n = lm_length(model.config, 8, backward=True, tokens=18)
    assert losses[1].ndim == 0 and float(losses[1]) > 0
    assert_close_fp(losses[1], losses[0], length=n)
    for a, b in zip(grads[1], grads[0]):
        assert_close_fp(a, b, length=n)
