"""RREDCoT's uncertainty score: entropy vs surprisal, and what the HF backend's entropies cost.

1. **Cost.** The HF backend's ``generate`` on the same requests (``--prompts`` x ``--group``,
   the run's sampling settings and seed), side by side in alternating turns: as shipped (an
   entropy per generated token) and with the entropy computation taken out. Prints the median
   seconds of each and their ratio.
2. **Segmentations.** ``--prompts`` x ``--group`` completions of the embedded task (arith, the
   ``make demo`` model) sampled by RREDCoT's rollouts, segmented by ``keyword_entropy`` with
   ``score=surprisal`` and ``score=entropy``: segments per row, uncertainty boundaries per row,
   the per-row Jaccard overlap of the two boundary sets, and the share of uncertainty boundaries
   that fall on a true step boundary (right after a ``</thought>``; ``--only-uncertainty`` drops
   delimiters and keywords so that the uncertainty boundaries may land there too).

Usage::

    python benchmarks/rredcot_entropy.py                      # 8 x 8 = 64 completions
    python benchmarks/rredcot_entropy.py --only-uncertainty
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch


def boundaries(spans) -> set[int]:
    return {a for a, _ in spans[1:]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15, help="timed generate calls per side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only-uncertainty", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)

    from creditlab.backends import hf as hf_module
    from creditlab.backends import sampling
    from creditlab.run.compose import compose
    from creditlab.run.config import build_parts, validate
    from creditlab.run.models import load_policy
    from creditlab.step.generation import thought_spans
    from creditlab.step.policy import ModelPolicyHandle
    from creditlab.step.rollout import RolloutSampler, collate
    from creditlab.types import GenerationRequest
    from creditlab_rredcot.segmenter import KeywordEntropySegmenter

    cfg = validate(compose(["method=rredcot", "logger=none", f"rollout.group_size={args.group}"]))
    model, tok, _ = load_policy(cfg["model"])
    parts = build_parts(cfg, model, tok)
    problems = parts["task"].load("train")[: args.prompts]
    backend, rollout = parts["backend"], cfg["rollout"]

    # -- 1. cost --------------------------------------------------------------------------------
    shipped = sampling.sample_tokens

    def no_entropy(logits, plan, gen):  # the draw and log-prob as shipped, no entropy computed
        if plan.greedy:
            tok_ = logits.argmax(-1)
            return tok_, torch.log_softmax(logits, -1).gather(1, tok_[:, None]).squeeze(1), tok_ * 0.0
        logp = torch.log_softmax(logits / plan.temperature, -1)
        tok_ = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
        return tok_, logp.gather(1, tok_[:, None]).squeeze(1), tok_ * 0.0

    if rollout.top_k or rollout.top_p < 1:
        raise SystemExit("the cost comparison's stand-in samples without truncation")
    sampler = RolloutSampler(rollout, backend, parts["verifier"])
    handle = ModelPolicyHandle(model, tok, backend, torch.Generator().manual_seed(args.seed),
                               rollout.temperature, 0, rollout_fn=sampler)
    trajs = parts["rollout"].collect(problems, handle, sampler, args.seed)  # RREDCoT's rollouts
    requests = [GenerationRequest(t.completion.prompt_ids) for t in trajs]
    sp = rollout.sampling(args.seed)
    times = {"entropies": [], "none": []}
    for r in range(args.rounds + 1):
        for side in (("entropies", "none") if r % 2 == 0 else ("none", "entropies")):
            hf_module.sample_tokens = shipped if side == "entropies" else no_entropy
            t0 = time.perf_counter()
            out = backend.generate(requests, sp)
            if r:  # round 0 warms up
                times[side].append(time.perf_counter() - t0)
            if side == "none":
                tokens_none = [c.response_ids for c in out]
            else:
                tokens_ent = [c.response_ids for c in out]
        assert tokens_none == tokens_ent, "the entropy computation changed the sampled tokens"
    hf_module.sample_tokens = shipped
    a, b = statistics.median(times["entropies"]), statistics.median(times["none"])
    n_tok = sum(len(c.logprobs) for c in out)
    print(f"HF generate, {len(requests)} completions ({n_tok} tokens), {args.rounds} calls per "
          f"side: median with entropies {a:.3f} s, without {b:.3f} s, ratio {a / b:.3f}; "
          f"fastest {min(times['entropies']):.3f} vs {min(times['none']):.3f} s, ratio "
          f"{min(times['entropies']) / min(times['none']):.3f}")

    # -- 2. segmentations -------------------------------------------------------------------------
    batch = collate(trajs, tok.pad_token_id, rollout.truncation)
    base = parts["segmenter"].config
    if args.only_uncertainty:
        base = dataclasses.replace(base, delimiters=[], keywords=[])
    seg = {s: KeywordEntropySegmenter(dataclasses.replace(base, score=s), tokenizer=tok)
           for s in ("surprisal", "entropy")}
    spans = {s: seg[s].segment(batch).spans for s in seg}
    metrics = {s: seg[s].metrics() for s in seg}
    delim = tuple(tok.encode(rollout.delimiter, add_special_tokens=False))
    print(f"{len(trajs)} completions, {batch.response_mask.sum():.0f} tokens, "
          f"segmenter {'uncertainty only' if args.only_uncertainty else 'as configured'} "
          f"(entropy_quantile {base.entropy_quantile}, min_segment_tokens {base.min_segment_tokens})")
    jac, at_step = [], {s: [0, 0, 0] for s in seg}
    for i, t in enumerate(trajs):
        ids = t.completion.response_ids
        true = {b for _, b in thought_spans(ids, delim)[:-1]}
        sets = {s: boundaries(spans[s][i]) for s in seg}
        union = sets["surprisal"] | sets["entropy"]
        jac.append(len(sets["surprisal"] & sets["entropy"]) / len(union) if union else 1.0)
        for s in seg:
            at_step[s][0] += len(sets[s] & true)
            at_step[s][1] += sum(any(abs(b - x) <= 1 for x in true) for b in sets[s])
            at_step[s][2] += len(sets[s])
    for s in seg:
        m = metrics[s]
        print(f"  score={s:9s}: segments/row {m['segments_per_row']:.2f}, uncertainty boundaries/row "
              f"{m['entropy_boundaries_per_row']:.2f}, boundaries at a true step boundary "
              f"{at_step[s][0]}/{at_step[s][2]} (within one token: {at_step[s][1]})")
    print(f"  boundary Jaccard (per row, mean): {statistics.mean(jac):.3f}")
    ids = trajs[0].completion.response_ids
    for s in seg:  # one row, segments separated by |
        print(f"  row 0, {s}: " + " | ".join(repr(tok.decode(ids[a:b])) for a, b in spans[s][0]))


if __name__ == "__main__":
    main()
