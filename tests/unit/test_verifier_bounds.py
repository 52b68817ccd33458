"""Verifiers that cannot hang the trainer: adversarial completions (10 MB of unclosed boxes,
``#### 1e99999999``, towers of exponents, nested fractions, megabytes of digits) score 0 within
seconds, legitimate answers still score 1, and every built-in verifier has a hard per-completion
time limit (``timeout_s``) whose overruns are counted as outcome ``timeout``.

Before this, ``gsm8k`` spent more than 10 minutes on 10 MB of ``\\boxed{`` (a quadratic scan)
and more than 2 minutes on ``#### 1e99999999`` (``Fraction`` built a 100-million-digit integer),
in the training process, with no limit.
"""

from __future__ import annotations

import time

import pytest
from creditlab.errors import ConfigError
from creditlab.registry import build_part
from creditlab.run.compose import compose
from creditlab.run.config import validate
from creditlab.types import Completion, Problem
from creditlab_arith.verifier import ArithVerifier
from creditlab_math.extract import (
    MAX_EXPONENT,
    MAX_NUMBER_CHARS,
    last_boxed,
    last_number,
    numbers_in,
    to_number,
)
from creditlab_math.testing import inject_faults
from creditlab_math.verifiers import GSM8KVerifier, MathVerifyVerifier

MB = 1_000_000
#: How long one adversarial completion may take (linear work on 10 MB is ~1 s on the project's
#: 2-core machines; this leaves room for a busy machine).
BOUND_S = 5.0

# Adversarial completions that every verifier must turn into reward 0 quickly.
BOMBS = {
    "10 MB of unclosed boxes": "\\boxed{" * (10 * MB // 7),
    "#### 1e99999999": "#### 1e99999999",
    "huge exponent in a box": "\\boxed{1e999999999}",
    "huge exponent, last number": "so it is 1e999999999",
    "tower of powers": "\\boxed{10^{10^{10}}}",
    "nested fractions": "\\boxed{" + "\\frac{1}{" * 2000 + "2" + "}" * 2000 + "}",
    "10 MB of digits": "9" * (10 * MB),
    "10 MB of digits in a box": "\\boxed{" + "9" * (10 * MB) + "}",
    "10 MB of digits after ####": "#### " + "9" * (10 * MB),
    "1 MB comma chain": "1,234" + ",234" * (MB // 4) + "5",
}


def completion(text: str) -> Completion:
    return Completion(prompt_ids=(), response_ids=(), logprobs=(), finish_reason="eos", text=text)


def timed_score(verifier, gold: str, text: str):
    start = time.monotonic()
    rewards = verifier.score([Problem(id="p", prompt="q", answer=gold)], [completion(text)])
    return rewards.values[0], rewards.info[0], time.monotonic() - start


# -- extraction: linear and bounded ----------------------------------------------------------------
def test_last_boxed_is_linear_on_unclosed_boxes():
    """The scan used to restart at every ``\\boxed{``: 40 KB took 7 s, 10 MB over 10 minutes."""
    start = time.monotonic()
    assert last_boxed("\\boxed{" * (10 * MB // 7)) is None
    assert last_boxed("\\boxed{1} " + "\\boxed{" * (MB // 7)) == "1"  # earlier complete box
    assert time.monotonic() - start < BOUND_S


def test_number_scan_is_linear_on_comma_chains():
    """``"1,234,234,...,2345"`` made the number pattern retry the chain at every group."""
    text = "1,234" + ",234" * (MB // 4) + "5"
    start = time.monotonic()
    assert last_number(text) == "2345"
    assert numbers_in("x 1,234,567,8901 and 12,345 y") == ["1", "234", "567", "8901", "12345"]
    assert time.monotonic() - start < BOUND_S


@pytest.mark.parametrize("text", ["1e99999999", "1e-99999999", "-2.5E+400", "1e9_999_999"])
def test_exponents_beyond_the_double_range_are_not_numbers(text):
    start = time.monotonic()
    assert to_number(text) is None
    assert time.monotonic() - start < 0.5


def test_the_bounds_keep_every_legitimate_number():
    assert to_number("1e308") == 10**MAX_EXPONENT
    assert to_number("2.5e-3") * 1000 == 2.5
    assert to_number("$1,450,000.") == 1_450_000  # the longest GSM8K test answer
    assert to_number("0." + "3" * 90) is not None  # a long decimal expansion
    assert to_number("9" * MAX_NUMBER_CHARS) == 10**MAX_NUMBER_CHARS - 1
    assert to_number("9" * (MAX_NUMBER_CHARS + 1)) is None


# -- gsm8k -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gsm8k():
    """A generous limit: these completions must be handled by bounded extraction, not by it."""
    verifier = GSM8KVerifier(GSM8KVerifier.Config(timeout_s=30.0))
    yield verifier
    verifier.close()


@pytest.mark.parametrize("name", list(BOMBS))
def test_gsm8k_scores_bombs_zero_within_seconds(gsm8k, name):
    value, info, seconds = timed_score(gsm8k, "18", BOMBS[name])
    assert value == 0.0 and info["outcome"] in ("wrong", "no_answer"), info
    assert seconds < BOUND_S, f"{name}: {seconds:.1f} s"


@pytest.mark.parametrize(
    "text", ["#### 18", "so \\boxed{18}", "9 * 2 = 18", "#### 1.8e1", "#### $18.00"]
)
def test_gsm8k_still_pays_legitimate_answers(gsm8k, text):
    value, info, _ = timed_score(gsm8k, "18", text)
    assert (value, info["outcome"]) == (1.0, "correct"), info


def test_gsm8k_hard_limit_kills_a_slow_check_and_scores_the_rest():
    """A real slow input (20 MB of brace pairs inside a box: seconds of linear work) overruns a
    0.3 s limit: outcome ``timeout``, reward 0, counted; the items queued behind it in the same
    worker never started, go back to the queue and are scored normally."""
    verifier = GSM8KVerifier(GSM8KVerifier.Config(timeout_s=0.3, workers=1))
    try:
        texts = ["#### 18", "\\boxed{" + "{}" * (10 * MB), "#### 18", "#### 17", "\\boxed{18}"]
        start = time.monotonic()
        rewards = verifier.score(
            [Problem(id=str(i), prompt="q", answer="18") for i in range(len(texts))],
            [completion(t) for t in texts],
        )
        seconds = time.monotonic() - start
        assert [i["outcome"] for i in rewards.info] == [
            "correct", "timeout", "correct", "wrong", "correct"
        ], rewards.info
        assert rewards.values == (1.0, 0.0, 1.0, 0.0, 1.0)
        assert "0.3 s" in rewards.info[1]["error"]
        assert seconds < BOUND_S
        metrics = verifier.metrics()
        assert metrics["timeout_count"] == 1 and metrics["worker_restarts"] == 1
    finally:
        verifier.close()


# -- arith -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def arith():
    verifier = ArithVerifier(
        ArithVerifier.Config(timeout_s=1.0, workers=1),
        worker_initializer=inject_faults,
        worker_initargs=("<<HANG>>", "<<CRASH>>", "<<RAISE>>", 3600.0, "creditlab_arith.answer:check"),
    )
    yield verifier
    verifier.close()


@pytest.fixture(scope="module")
def arith_generous():
    """As ``gsm8k``'s: a limit above the bound, so that a bomb must be handled by the bounded
    parse, not cut off by the limit (10 MB of unclosed boxes is 0.9 s of linear work on an Intel
    Xeon, 2 cores: a 1 s limit turned it into ``timeout`` there)."""
    verifier = ArithVerifier(ArithVerifier.Config(timeout_s=30.0, workers=1))
    yield verifier
    verifier.close()


@pytest.mark.parametrize("name", list(BOMBS))
def test_arith_scores_bombs_zero_within_seconds(arith_generous, name):
    value, info, seconds = timed_score(arith_generous, "12", BOMBS[name])
    assert value == 0.0 and info["outcome"] in ("wrong", "no_answer"), info
    assert seconds < BOUND_S, f"{name}: {seconds:.1f} s"


def test_arith_hard_limit_and_crash_are_counted_outcomes(arith):
    """A check that hangs for an hour is cut off at the 1 s limit; one that kills its worker is an
    ``error``; the batch goes on and legitimate answers still score 1."""
    arith.metrics()
    texts = ["7+5=\\boxed{12}", "<<HANG>> \\boxed{12}", "<<CRASH>>", "\\boxed{13}", "\\boxed{12}"]
    start = time.monotonic()
    rewards = arith.score(
        [Problem(id=str(i), prompt="q", answer="12") for i in range(len(texts))],
        [completion(t) for t in texts],
    )
    assert time.monotonic() - start < BOUND_S
    assert [i["outcome"] for i in rewards.info] == [
        "correct", "timeout", "error", "wrong", "correct"
    ], rewards.info
    assert rewards.values == (1.0, 0.0, 0.0, 0.0, 1.0)
    metrics = arith.metrics()
    assert metrics["timeout_rate"] == metrics["error_rate"] == 0.2
    assert metrics["worker_restarts"] == 2


# -- the limit is validated before the model loads --------------------------------------------------
@pytest.mark.parametrize("name", ["gsm8k", "arith", "math_verify"])
@pytest.mark.parametrize("bad", ["0", "-1.0", "nan", "inf"])
def test_timeout_s_must_be_positive_and_finite(name, bad):
    """``validate`` (which runs before the model loads) rejects it with the key and the value."""
    with pytest.raises(ConfigError, match=r"verifier\.timeout_s must be > 0 .*got"):
        validate(compose([f"verifier={name}", f"verifier.timeout_s={bad}"]))


@pytest.mark.parametrize("name", ["gsm8k", "arith"])
def test_workers_must_be_at_least_one(name):
    with pytest.raises(ConfigError, match=r"verifier\.workers must be >= 1.*got 0"):
        build_part("verifier", {"name": name, "workers": 0})
    assert build_part("verifier", {"name": name, "timeout_s": 0.5}).config.timeout_s == 0.5


# -- math_verify -----------------------------------------------------------------------------------
MATH_BOMBS = {  # completion -> the outcome math-verify gives it
    "\\boxed{1e999999999}": "wrong",
    "\\boxed{10^{10^{10}}}": "timeout",  # sympy evaluates the tower: only the hard limit ends it
    "\\boxed{" + "\\frac{1}{" * 20 + "2" + "}" * 20 + "}": "timeout",  # exponential in depth
    "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}": "wrong",  # over MAX_ANSWER_CHARS
    "\\boxed{" + "9" * (10 * MB) + "}": "wrong",  # over MAX_ANSWER_CHARS: never parsed
    "9" * (10 * MB): "timeout",  # no box: math-verify's whole-text extraction, cut off
}


@pytest.mark.slow
def test_math_verify_bombs_score_zero_within_its_limit():
    """Each bomb is ``wrong`` at once (answers longer than ``MAX_ANSWER_CHARS`` are never
    parsed) or cut off by the 2 s hard limit (``timeout``, counted); a legitimate answer in the
    same batch scores 1. An item costs at most its limit plus a worker restart (math-verify's
    import, timed here as the first call)."""
    verifier = MathVerifyVerifier(MathVerifyVerifier.Config(timeout_s=2.0, workers=2))
    try:
        start = time.monotonic()
        assert timed_score(verifier, "18", "\\boxed{18}")[0] == 1.0
        startup = time.monotonic() - start
        texts = [*MATH_BOMBS, "so the answer is \\boxed{18}"]
        start = time.monotonic()
        rewards = verifier.score(
            [Problem(id=str(i), prompt="q", answer="18") for i in range(len(texts))],
            [completion(t) for t in texts],
        )
        seconds = time.monotonic() - start
        outcomes = [i["outcome"] for i in rewards.info]
        assert outcomes == [*MATH_BOMBS.values(), "correct"], rewards.info
        assert rewards.values == (0.0,) * len(MATH_BOMBS) + (1.0,)
        timeouts = outcomes.count("timeout")
        assert seconds < len(texts) * 2.0 + timeouts * 2 * startup, (seconds, startup)
        metrics = verifier.metrics()
        assert metrics["timeout_count"] == timeouts and metrics["worker_restarts"] == timeouts
    finally:
        verifier.close()
