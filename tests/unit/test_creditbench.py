"""The credit bench's ground truth on a scripted sampler with known values, and every score on
hand-made cases (framework/creditlab/creditbench)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch
from creditlab.creditbench import BenchError, BenchSettings
from creditlab.creditbench import truth as truth_mod
from creditlab.creditbench.bench import per_thought
from creditlab.creditbench.scores import (
    CreditScorer,
    blame_hits,
    interval,
    most_negative,
    prompt_weights,
    scaled_error,
    selector_outcomes,
    selector_scores,
    sign_counts,
    within_chain,
)
from creditlab.creditbench.truth import compute_truth, k_needed, noise, spearman_brown
from creditlab.errors import RegistryError
from creditlab.types import Completion, Problem, Trajectory

PROBLEM = Problem("p0", "q", "a")


def chain(prompt_ids, response_ids, reward):
    c = Completion(tuple(prompt_ids), tuple(response_ids), (0.0,) * len(response_ids), "stop", "")
    return Trajectory(PROBLEM, c, float(reward), 0)


class ScriptedSampler:
    """Rewards by prefix length: the i-th continuation of a state whose prefix has length L is
    correct when ``i % 4 < WINS[L]`` (so K = 4 gives V = WINS[L] / 4 exactly)."""

    WINS: ClassVar[dict[int, int]] = {0: 2, 2: 3, 4: 1}

    def __init__(self):
        self.calls, self.seen = [], []

    def __call__(self, problems, requests, seed):
        self.calls.append((len(requests), seed))
        out = []
        for req in requests:
            i = sum(1 for r in self.seen if r == (req.prompt_ids, req.prefix_ids))
            self.seen.append((req.prompt_ids, req.prefix_ids))
            out.append(chain(req.prompt_ids, req.prefix_ids, float(i % 4 < self.WINS[len(req.prefix_ids)])))
        return out


def test_truth_values_and_step_advantages_by_hand():
    # Two chains of one prompt share s_0 and s_1 (prefix [7, 8]); they differ after it.
    trajs = [chain([1], [7, 8, 9, 9, 5], 0.0), chain([1], [7, 8, 9, 3, 5], 1.0)]
    spans = [((0, 2), (2, 4), (4, 5)), ((0, 2), (2, 4), (4, 5))]
    sampler = ScriptedSampler()
    chains, counts = compute_truth(trajs, [0, 0], spans, sampler, k=4, seed=3)
    # States: (), (7, 8), (7, 8, 9, 9), (7, 8, 9, 3): four, each valued once.
    assert counts["states"] == 4 and counts["continuations"] == 16
    v0, v1, v2 = 2 / 4, 3 / 4, 1 / 4
    np.testing.assert_allclose(chains[0].values, [v0, v1, v2])
    np.testing.assert_allclose(chains[0].advantages, [v1 - v0, v2 - v1, 0.0 - v2])
    np.testing.assert_allclose(chains[1].advantages, [v1 - v0, v2 - v1, 1.0 - v2])
    # Standard error of V with rewards (1, 1, 0, 0): std (ddof 1) / sqrt(4).
    se0 = np.std([1, 1, 0, 0], ddof=1) / 2
    assert chains[0].value_se[0] == pytest.approx(se0)
    # The last step's error is the last value's alone (the reward is exact).
    assert chains[0].advantage_se[2] == pytest.approx(chains[0].value_se[2])
    assert chains[0].advantage_se[0] == pytest.approx(np.hypot(chains[0].value_se[0], chains[0].value_se[1]))
    # Halves: continuations 0-1 and 2-3 of each state.
    np.testing.assert_allclose(chains[0].halves[0], [1.0 - 1.0, 0.5 - 1.0, 0.0 - 0.5])
    np.testing.assert_allclose(chains[0].halves[1], [0.5 - 0.0, 0.0 - 0.5, 0.0 - 0.0])


def test_truth_is_chunked_with_fixed_seeds(monkeypatch):
    monkeypatch.setattr(truth_mod, "CHUNK", 6)
    trajs = [chain([1], [7, 8, 9, 9, 5], 0.0)]
    sampler, done = ScriptedSampler(), []
    compute_truth(trajs, [0], [((0, 2), (2, 4), (4, 5))], sampler, k=4, seed=3,
                  progress=lambda n, total: done.append((n, total)))
    assert [n for n, _ in sampler.calls] == [6, 6]
    assert [s for _, s in sampler.calls] == [truth_mod.chunk_seed(3, 0), truth_mod.chunk_seed(3, 1)]
    assert done == [(6, 12), (12, 12)]


def test_a_chain_without_thoughts_gets_no_truth():
    chains, counts = compute_truth([chain([1], [], 0.0)], [0], [()], ScriptedSampler(), k=4, seed=0)
    assert len(chains[0].advantages) == 0 and counts["states"] == 0


def test_noise_reliability_and_k_needed():
    a = np.array([0.5, -0.5, 0.5, -0.5])
    c = truth_mod.ChainTruth(0, 0.0, (), np.zeros(4), np.full(4, 0.1), a, np.full(4, 0.25), (a, a))
    got = noise([c], value_split_half=0.9)
    # variance of A = 0.25, noise variance = 0.0625 -> reliability 0.75; floor 0.0625 / 0.25.
    assert got["advantage_reliability"] == pytest.approx(0.75)
    assert got["error_floor"] == pytest.approx(0.25)
    assert got["advantage_split_half"] == pytest.approx(1.0)
    # Reliability 0.2 at K = 8; reaching 0.5 needs noise / 4: K = 32.
    assert k_needed(8, 0.2, 0.5) == 32
    assert k_needed(8, -0.1, 0.5) is None
    assert np.isnan(spearman_brown(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0])))
    # Halves correlated r = 0.5 -> the full-K estimate's reliability 2r / (1 + r) = 2/3.
    x, y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 1.0, 4.0, 3.0])
    assert spearman_brown(x, y) == pytest.approx(2 * 0.6 / 1.6)


# -- scores ---------------------------------------------------------------------------------------

def test_within_chain_constant_credit_ranks_nothing():
    truth = [np.array([0.0, -0.5, 0.1]), np.array([0.3]), np.array([0.2, 0.2])]
    credit = [np.array([-1.0, -1.0, -1.0]), np.array([1.0]), np.array([0.0, 1.0])]
    got = within_chain(truth, credit)
    assert got[0] == 0.0  # constant credit
    assert np.isnan(got[1]) and np.isnan(got[2])  # one thought; constant truth
    assert within_chain([np.array([0.0, -0.5, 0.1])], [np.array([0.1, -2.0, 3.0])])[0] == pytest.approx(1.0)


def test_blame_hits_count_ties_fractionally():
    truth = [np.array([0.0, -0.6, -0.1]), np.array([0.0, -0.6, -0.1]), np.array([0.2, 0.1])]
    credit = [np.array([-0.1, -0.9, 0.0]), np.array([-1.0, -1.0, -1.0]), np.array([0.0, -1.0])]
    got = blame_hits(truth, credit, np.array([True, True, False]))
    assert got[0] == 1.0
    assert got[1] == pytest.approx(1 / 3)  # three-way tie containing the true step
    assert np.isnan(got[2])  # not failed
    assert most_negative(np.array([0.0, -0.5, -0.5])) == 1  # earliest of the smallest


def test_sign_counts_threshold_and_zero_credit():
    truth = [np.array([0.5, -0.3, 0.1, -0.6])]
    credit = [np.array([1.0, 0.0, -1.0, -2.0])]
    big, agree = sign_counts(truth, credit, 0.25)
    assert big[0] == 3 and agree[0] == 2  # 0.5 agrees, -0.3 gets zero (disagrees), -0.6 agrees


def test_scaled_error_by_hand():
    t, e = np.array([1.0, -2.0, 0.0]), np.array([2.0, -4.0, 0.0])
    m = np.array([e @ e, e @ t, t @ t])
    assert scaled_error(m) == pytest.approx(0.0)  # perfect up to scale
    assert scaled_error(np.array([0.0, 0.0, 5.0])) == 1.0  # zero credit
    e2 = np.array([1.0, 1.0, 0.0])  # s = (1 - 2) / 2 = -0.5; residual (1.5, -1.5, 0): 4.5 / 5
    assert scaled_error(np.array([e2 @ e2, e2 @ t, t @ t])) == pytest.approx(0.9)


def test_credit_scorer_weights_and_perfect_estimator():
    truth = [np.array([0.0, -0.5]), np.array([0.25, 0.0, 0.5])]
    perfect = CreditScorer(truth, [3 * t for t in truth], np.array([True, False]), 0.2)
    got = perfect(np.ones(2))
    assert got["spearman"] == pytest.approx(1.0) and got["error"] == pytest.approx(0.0)
    assert got["sign"] == 1.0 and got["blame_hit"] == 1.0 and got["spearman_within"] == pytest.approx(1.0)
    # Weight 0 drops a chain: only the failed one is left.
    assert perfect(np.array([1.0, 0.0]))["spearman_within"] == pytest.approx(1.0)
    assert np.isnan(perfect(np.array([0.0, 2.0]))["blame_hit"])


def test_rounding_noise_does_not_rank_a_constant_credit():
    # A sequence advantage averaged over thoughts of different lengths differs in the last bits.
    a = 0.35355339
    credit = [np.array([a * (1 + 1e-9), a * (1 - 2e-9), a])]
    assert np.ptp(credit[0]) > 0
    got = CreditScorer([np.array([0.1, -0.5, 0.2])], credit, np.array([True]), 0.25)(np.ones(1))
    assert got["spearman_within"] == 0.0 and got["blame_hit"] == pytest.approx(1 / 3)


def test_selector_outcomes():
    truth = [np.array([0.0, -0.5, 0.0]), np.array([-0.4, 0.0]), np.array([0.1, 0.0, -0.3])]
    got = selector_outcomes(truth, [1, 1, 0], [1, None, 2])
    np.testing.assert_array_equal(got["exact"], [1, 0, 0])
    np.testing.assert_array_equal(got["late"], [0, 1, 0])
    np.testing.assert_array_equal(got["early"], [0, 0, 1])
    assert got["oracle_exact"][0] == 1 and np.isnan(got["oracle_exact"][1]) and got["oracle_exact"][2] == 0


def test_selector_scores_by_hand():
    # The same three chains; weights: the sample itself, then one replicate with chain 0 twice and chain 2 not drawn.
    truth = [np.array([0.0, -0.5, 0.0]), np.array([-0.4, 0.0]), np.array([0.1, 0.0, -0.3])]
    w = np.array([[1.0, 1.0, 1.0], [2.0, 1.0, 0.0]])
    got = selector_scores(truth, [1, 0, 0], [1, None, 2], w)
    assert got["exact"].value == pytest.approx(2 / 3)  # chains 0 and 1 reset at their worst step
    assert got["early"].value == pytest.approx(1 / 3) and got["late"].value == 0.0
    assert got["first_thought"].value == pytest.approx(2 / 3)  # chains 1 and 2 reset at thought 0
    assert got["oracle_exact"].value == pytest.approx(1 / 2)  # chain 1 has no oracle: left out
    assert got["exact"].low == got["exact"].high == pytest.approx(1.0)  # the one replicate: (2 + 1) / 3
    # Always thought 0: exact where the worst step is the first (chain 1 only), else early, never late.
    ref = selector_scores(truth, [0, 0, 0], [1, None, 2], w)
    assert ref["exact"].value == pytest.approx(1 / 3) and ref["late"].value == 0.0
    assert ref["first_thought"].value == 1.0


def test_prompt_weights_resample_whole_prompts():
    prompt_of = np.array([0, 0, 1, 1, 2])
    w = prompt_weights(prompt_of, 3, 50, seed=1)
    assert w.shape == (51, 5) and (w[0] == 1).all()
    assert (w[1:, 0] == w[1:, 1]).all() and (w[1:, 2] == w[1:, 3]).all()  # a prompt's chains move together
    assert (w[1:, [0, 2, 4]].sum(1) == 3).all()  # three prompts drawn each time
    np.testing.assert_array_equal(w, prompt_weights(prompt_of, 3, 50, seed=1))


def test_interval_quantiles_skip_nan():
    iv = interval(0.5, np.array([np.nan, *np.linspace(0, 1, 101)]))
    assert (iv.value, iv.low, iv.high) == pytest.approx((0.5, 0.025, 0.975))
    assert np.isnan(interval(0.1, np.array([np.nan])).low)


def test_per_thought_sum_and_mean_over_trained_tokens():
    adv = torch.tensor([1.0, 1.0, 2.0, 4.0, 0.0])
    mask = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0])
    sums, means = per_thought(adv, mask, ((0, 2), (2, 4), (4, 5)))
    np.testing.assert_allclose(sums, [1.0, 6.0, 0.0])
    np.testing.assert_allclose(means, [1.0, 3.0, 0.0])


@pytest.mark.parametrize("kwargs, words", [
    ({"k": 1}, "--k must be at least 2"),
    ({"prompts": 1}, "--prompts must be at least 2"),
    ({"rank_by": "spearman/median"}, "--rank-by must be"),
    ({"min_reliability": 1.5}, "--min-reliability"),
    ({"estimators": ("no_such_estimator",)}, "no_such_estimator"),
])
def test_bad_settings_are_named(kwargs, words):
    with pytest.raises((BenchError, RegistryError)) as err:
        BenchSettings(**kwargs).check()
    assert words in str(err.value)


def test_refusal_names_the_k_that_would_do():
    from types import SimpleNamespace

    from creditlab.creditbench.bench import Bench

    fake = SimpleNamespace(settings=BenchSettings(k=8, min_reliability=0.5))
    with pytest.raises(BenchError) as err:
        Bench.refuse_if_noisy(fake, {"advantage_reliability": 0.2, "advantage_se": 0.15})
    assert "reliability is 0.20" in str(err.value) and "raise --k to at least 32" in str(err.value)
    Bench.refuse_if_noisy(fake, {"advantage_reliability": 0.6, "advantage_se": 0.05})  # enough: no error


def test_each_estimator_gets_the_segmenter_its_method_pairs_it_with():
    from creditlab.creditbench.bench import method_segmenters

    pairs = method_segmenters()
    assert pairs["rredcot"] == "keyword_entropy"  # conf/method/rredcot.yaml
    assert pairs["ibpo"] == "thought"
    assert pairs["mc_value"] == "thought"  # conf/method/vineppo.yaml


@pytest.mark.parametrize("micro, expected", [(0, 4 * 3), (5, 5)])
def test_bench_forward_passes_take_at_most_a_training_steps_rows(micro, expected):
    """The estimators get every chain of the bench at once; without loss.micro_batch_size their
    forward passes are cut to a training step's rows (a real model's logits over all 192 chains of
    a bench took more than 24 GiB)."""
    from types import SimpleNamespace

    from creditlab.creditbench.bench import Bench
    from tests.helpers import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    fake = SimpleNamespace(seed=0, checked={
        "rollout": SimpleNamespace(temperature=1.0, group_size=3, chat_template="auto"),
        "loss": SimpleNamespace(micro_batch_size=micro, fused_head="auto"), "run": SimpleNamespace(prompts_per_step=4)})
    handle = Bench.handle(fake, model, tok, backend=None, sampler=None, stream=0)
    assert handle.micro_batch_size == expected
    assert handle.micro_batch_tokens == 0  # no budget unless the bench resolved one
    assert Bench.handle(fake, model, tok, None, None, 0, tokens=1792).micro_batch_tokens == 1792


def test_the_bench_reads_each_parts_peak_memory():
    """Each part's cost carries the process's peak resident memory while it ran (Linux's VmHWM,
    reset before the part). In a fresh process (a long one's heap may hold the memory already):
    256 MiB touched raise the peak, and a reset forgets them."""
    import subprocess
    import sys

    from creditlab.run.memory_budget import peak_memory

    if not sys.platform.startswith("linux"):
        assert peak_memory() == {}
        return
    code = ("import torch; from creditlab.run.memory_budget import peak_memory as p, reset_peak_memory as r\n"
            "r(); b = torch.ones(64 * 2**20); high = p()['peak_rss_gib']; del b; r(); low = p()['peak_rss_gib']\n"
            "print(high - low)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert float(out.stdout.split()[-1]) > 0.2
    assert peak_memory()["peak_rss_gib"] > 0
