"""SRPO/RRPO against the official code (github.com/Ankur-Samanta/SRPO; docs/methods/srpo.md):
the rollout chat template as a setting (rollouts and evaluation plain, the localization call
chat-templated, as the code), the bare problem in the localization prompt, the base group's bias
toward successes, the fresh fallback of the splits without a base group, and chains that end at
EOS (our documented deviation)."""

from __future__ import annotations

import functools
import itertools
import json
from types import SimpleNamespace

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.step.generation import ThoughtConfig, generate_thoughts
from creditlab.step.policy import ModelPolicyHandle, encode_prompt
from creditlab.testing import FakePolicyHandle
from creditlab.types import GenerationRequest, Problem, RolloutConfig, SamplingParams
from creditlab_math.tasks import (
    MATH_TEMPLATE,
    NUMINA_TEMPLATE,
    GSM8KTask,
    MathTask,
    NuminaOlympiadsTask,
)
from creditlab_resets.selectors import SelfLocalizeResetSelector

from tests.helpers import THOUGHT, char_tokenizer
from tests.unit.test_buffer import C, W, build
from tests.unit.test_chat_template import TEMPLATE, rendered
from tests.unit.test_generation import Scripted, enc
from tests.unit.test_resets_selectors import _Recorder, _seed

PROMPT = "What is 2+3? End each step with </thought>."


def templated_tokenizer():
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


# -- 1. the chat template of prompts is a setting ------------------------------------------------
def test_encode_prompt_follows_the_setting():
    tok, plain_tok = templated_tokenizer(), char_tokenizer()
    plain = tuple(tok(PROMPT, add_special_tokens=True)["input_ids"])
    assert encode_prompt(tok, PROMPT) == encode_prompt(tok, PROMPT, "auto") == rendered(tok, PROMPT)
    assert encode_prompt(tok, PROMPT, True) == rendered(tok, PROMPT)
    assert encode_prompt(tok, PROMPT, False) == plain != rendered(tok, PROMPT)
    assert encode_prompt(plain_tok, PROMPT, "auto") == encode_prompt(plain_tok, PROMPT, False) == plain
    with pytest.raises(ConfigError, match=r"rollout\.chat_template=true .*no chat template.*auto"):
        encode_prompt(plain_tok, PROMPT, True)
    with pytest.raises(ConfigError, match=r"reset_selector\.chat_template must be auto, true or false; got 'yes'"):
        encode_prompt(tok, PROMPT, "yes", "reset_selector.chat_template")
    with pytest.raises(ConfigError, match="must be auto, true or false"):
        encode_prompt(tok, PROMPT, 1)  # 1 == True in Python: not accepted as a setting


def test_rollout_chat_template_is_validated():
    assert RolloutConfig().chat_template == "auto"
    assert RolloutConfig(chat_template=False).chat_template is False
    with pytest.raises(ValueError, match=r"rollout\.chat_template must be auto, true or false, got 'plain'"):
        RolloutConfig(chat_template="plain")


def test_default_config_keeps_the_template_and_a_bad_value_is_a_config_error():
    from creditlab.run.compose import compose
    from creditlab.run.config import validate

    assert validate(compose([]))["rollout"].chat_template == "auto"
    assert validate(compose(["rollout.chat_template=false"]))["rollout"].chat_template is False
    with pytest.raises(ConfigError, match=r"rollout.*chat_template must be auto, true or false"):
        validate(compose(["rollout.chat_template=sometimes"]))


def test_parts_and_evaluation_encode_problems_as_the_rollouts_do():
    """The run's handle (rollout strategies, evaluation, value prompts) encodes with
    ``rollout.chat_template``."""
    from creditlab.step.evaluation import EvalConfig
    from creditlab.step.losses import LossConfig
    from creditlab.step.module import CreditAssignmentModule

    from tests.helpers import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()
    tok = templated_tokenizer()
    plain = tuple(tok(PROMPT, add_special_tokens=True)["input_ids"])
    parts = SimpleNamespace(backend=None, sampler=None, verifier=None)
    for setting, expected in (("auto", rendered(tok, PROMPT)), (False, plain)):
        module = CreditAssignmentModule(
            model, tok, parts, None, [], LossConfig(), RolloutConfig(chat_template=setting),
            EvalConfig(every=0), functools.partial(torch.optim.SGD, lr=0.1), seed=0,
        )
        assert module.handle(3).encode(PROMPT) == expected
        assert module.handle(3, stream=1).encode(PROMPT) == expected  # the evaluation's handle
    handle = ModelPolicyHandle(model, tok, None, torch.Generator(), chat_template=False)
    assert handle.encode(PROMPT) == plain


@pytest.mark.parametrize("setting", ["auto", False])
def test_the_localization_prompt_has_its_own_setting(setting):
    """Rollouts plain or not, the localizer's prompt goes through the chat template under
    ``reset_selector.chat_template=auto`` (the official code), and is plain text under false."""
    tok = templated_tokenizer()
    traj, spans = _seed(Problem("p", "Start 1, +1.", "2"), "1+1=\\boxed{3}</thought>", tok)
    gen = _Recorder(["\\boxed{1}"])
    ctx = FakePolicyHandle(tokenizer=tok, generate_fn=gen)
    config = SelfLocalizeResetSelector.Config(chat_template=setting)
    SelfLocalizeResetSelector(config).select(traj, spans, ctx)
    shown = tok.decode(list(gen.calls[0][0][0].prompt_ids))
    assert "Problem: Start 1, +1." in shown and "Step 1:" in shown
    templated = shown.startswith("<bos>[user]\n") and shown.endswith("[assistant]\n")
    assert templated == (setting == "auto")
    with pytest.raises(ConfigError, match=r"reset_selector\.chat_template must be auto, true or false"):
        SelfLocalizeResetSelector.Config(chat_template="never")


# -- 3. the bare problem stays in the metadata ---------------------------------------------------
def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_math_numina_and_gsm8k_problems_keep_the_bare_problem(tmp_path):
    bare = "Find x such that 2x = 6."
    math_file = _jsonl(tmp_path / "math.jsonl", [{"problem": bare, "answer": "3", "level": "1"}])
    (p,) = MathTask(MathTask.Config(path=str(math_file))).load("test")
    assert p.prompt == MATH_TEMPLATE.replace("{problem}", bare) and p.metadata["problem"] == bare
    assert p.metadata["level"] == "1"
    numina = tmp_path / "numina"
    numina.mkdir()
    _jsonl(numina / "test.jsonl", [{"id": "n0", "problem": bare, "answer": "3", "solution": "\\boxed{3}"}])
    (n,) = NuminaOlympiadsTask(NuminaOlympiadsTask.Config(path=str(numina))).load("test")
    assert n.prompt == NUMINA_TEMPLATE.replace("{problem}", bare)
    assert n.metadata["problem"] == bare and n.metadata["solution"] == "\\boxed{3}"
    gsm_file = _jsonl(tmp_path / "gsm.jsonl", [{"question": bare, "answer": "2x=6\n#### 3"}])
    (g,) = GSM8KTask(GSM8KTask.Config(path=str(gsm_file))).load("test")
    assert g.metadata["problem"] == bare and g.prompt != bare

    # problem_field=problem (the SRPO presets): the localizer shows the bare problem only.
    tok = char_tokenizer()
    traj, spans = _seed(n, "2x=6</thought>x=\\boxed{4}</thought>", tok)
    for field, instruction_shown in (("problem", False), ("", True)):
        gen = _Recorder(["\\boxed{2}"])
        config = SelfLocalizeResetSelector.Config(problem_field=field)
        SelfLocalizeResetSelector(config).select(traj, spans, FakePolicyHandle(tokenizer=tok, generate_fn=gen))
        shown = tok.decode(list(gen.calls[0][0][0].prompt_ids))
        assert f"Problem: {bare}" in shown or instruction_shown
        assert ("one step at a time" in shown) == instruction_shown


# -- 5. chains end at EOS (documented deviation) -------------------------------------------------
def test_a_chain_ends_at_eos_without_asking_for_more_thoughts():
    """The official loop asks for another thought after an EOS (until ``\\boxed{`` or the
    budget); ours ends the chain there (docs/methods/srpo.md says why)."""
    backend = Scripted({"p": [("a" + THOUGHT, "stop"), ("b<eos>", "eos"), ("\\boxed{2}" + THOUGHT, "stop")]})
    (chain,) = generate_thoughts(
        backend, [GenerationRequest(enc("p"))], SamplingParams(temperature=0.7, seed=1),
        ThoughtConfig(max_thoughts=20, max_thought_tokens=8),
    )
    assert chain.finish_reason == "eos" and len(backend.calls) == 2
    assert "\\boxed" not in chain.text and len(backend.scripts[enc("p")]) == 1


# -- 6. the base group leans toward successes; fallbacks without a base group draw fresh chains --
@pytest.mark.parametrize("p", [0.3, 0.5, 0.8])
def test_the_1x4_base_group_is_biased_toward_successes(p):
    """Every outcome of the first five draws, weighted by its probability under success rate p:
    the base group holds the first draws minus the seed (a failure), so its expected failures
    are 4(1-p) - (p - p^5), below the 4(1-p) of four i.i.d. chains."""
    expected_failures = 0.0
    for outcomes in itertools.product((C, W), repeat=5):
        weight = p ** outcomes.count(C) * (1 - p) ** outcomes.count(W)
        result, _ = build({"q": list(outcomes)}, split="1x4")
        base = [t for t in result.trajectories if t.group_id == 0][:4]
        expected_failures += weight * sum(t.reward == 0 for t in base)
    assert expected_failures == pytest.approx(4 * (1 - p) - (p - p**5))
    assert expected_failures < 4 * (1 - p)


def test_1x8_fallback_draws_fresh_chains_instead_of_reusing_the_correct_draws():
    """No failure in 12 draws: the official 1x8 loop trains on the first 8 (correct) draws, a
    group with zero advantages; ours discards them and draws 8 fresh chains (here all wrong)."""
    result, script = build({"q": [C] * 12 + [W] * 8}, split="1x8")
    assert script.drawn["q"] == 20 and result.stats["discarded"] == 12
    assert [(t.role, t.reward) for t in result.trajectories] == [("fallback", 0.0)] * 8
