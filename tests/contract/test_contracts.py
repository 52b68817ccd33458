"""Every registered part of this distribution passes its contract check."""

import pytest
from creditlab.registry import REGISTRIES
from creditlab.testing import (
    FakePolicyHandle,
    check_backend,
    check_common,
    check_part,
    check_verifier,
    make_batch,
)
from creditlab.types import Completion, Problem, RolloutConfig

KINDS = ("task", "backend", "verifier", "segmenter", "reset_selector", "rollout", "advantage")
PARTS = [(k, n) for k in KINDS for n in REGISTRIES[k].names() if REGISTRIES[k].entries[n].dist == "creditlab"]

# Hub-backed tasks need a local file in tests; the fixture paths are set here.
TASK_OPTIONS = {
    "gsm8k": {"path": "tests/fixtures/math/gsm8k_small.jsonl"},
    "math": {"path": "tests/fixtures/math/math_small.jsonl"},
    "numina_olympiads": {"path": "tests/fixtures/math/numina_prepared"},
}


def _verifier_inputs(name):
    if name == "arith":
        problems = list(REGISTRIES["task"].get("arith")().load("test"))[:3]
        texts = [problems[0].metadata["solution"], "1+1=\\boxed{3}</thought>", "garbage"]
    elif name == "code_tests":
        problems = list(REGISTRIES["task"].get("code")().load("test"))[:3]
        texts = [f"```python\n{problems[0].answer}```", "```python\ndef f(:\n```", ""]
    else:
        problems = [Problem("a", "q", "18"), Problem("b", "q", "18"), Problem("c", "q", "18")]
        texts = ["so #### 18 and \\boxed{18}", "\\boxed{17}", "no answer here"]
    completions = [Completion((1,), (2, 3), (-0.1, -0.2), "eos", t) for t in texts]
    return problems, completions


def _reset_inputs():
    """Seeds whose problems have a step oracle, and a policy that decodes and answers
    localization prompts (so every selector, oracle and self_localize included, can run)."""
    from tests.helpers import char_tokenizer

    tok = char_tokenizer()
    task = REGISTRIES["task"].get("arith")
    problems = task(task.Config(num_train=1, num_test=3)).load("test")

    def answer(requests, sampling):
        text = "Step 1 looks fine. \\boxed{2}"
        return [Completion(r.prompt_ids, (5, 6), (-0.1, -0.2), "eos", text) for r in requests]

    batch = make_batch(groups=3, group_size=4, vocab=len(tok), seed=4, problems=problems)
    return batch, FakePolicyHandle(tokenizer=tok, generate_fn=answer)


@pytest.mark.parametrize("kind,name", PARTS, ids=[f"{k}:{n}" for k, n in PARTS])
def test_contract(kind, name, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).parents[2])
    cls = REGISTRIES[kind].get(name)
    if (kind, name) == ("backend", "vllm"):
        pytest.skip("tests/vllm checks the vLLM backend's contract (marker vllm, `make test-vllm`)")
    if kind == "backend":
        from tests.helpers import tiny_model_and_tokenizer

        model, tok = tiny_model_and_tokenizer()
        part = cls(model=model, tokenizer=tok)
        check_common(kind, part)
        check_backend(part, [tuple(tok.encode("1+2=")), tuple(tok.encode("hello"))])
    elif kind == "verifier":
        part = cls()
        try:
            check_common(kind, part)
            check_verifier(part, *_verifier_inputs(name))
            assert part.metrics(), "a verifier reports its outcome counts"
        finally:
            part.close()
    elif kind == "segmenter":
        from tests.helpers import char_tokenizer

        part = cls(tokenizer=char_tokenizer())
        check_part(kind, part, batch=make_batch(vocab=40, seed=5))
    elif kind == "task":
        options = TASK_OPTIONS.get(name, {})
        part = cls(cls.Config(**options))
        check_part(kind, part, splits=("train", "test") if name in ("arith", "word_problems") else ("test",))
    elif kind == "reset_selector":
        batch, ctx = _reset_inputs()
        check_part(kind, cls(), batch=batch, ctx=ctx)
    elif kind == "rollout":
        batch, ctx = _reset_inputs()
        problems = list({t.problem.id: t.problem for t in batch.trajectories}.values())
        selectors = [REGISTRIES["reset_selector"].get(n)() for n in ("random", "oracle")]
        configs = [cls.Config(split=s) for s in ("1x4", "2x4", "1x8")] if cls.uses_reset_selector else [cls.Config()]
        for config in configs:
            for selector in selectors if cls.uses_reset_selector else [None]:
                part = cls(config, rollout=RolloutConfig(group_size=8), tokenizer=ctx.tokenizer,
                           reset_selector=selector)
                check_part(kind, part, problems=problems)
    elif kind == "advantage" and cls.__module__ == "creditlab_controls.advantage" and name != "reward_flip":
        batch, ctx = _reset_inputs()  # the credit controls read the step oracle's thoughts
        problems = list({t.problem.id: t.problem for t in batch.trajectories}.values())
        check_part(kind, cls(), problems=problems, tokenizer=ctx.tokenizer)
    else:
        check_part(kind, cls())
