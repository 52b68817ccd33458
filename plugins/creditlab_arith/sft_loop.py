"""The supervised warm-start loop shared by the model recipes (``arith_tiny``, ``smollm2_135m_sft``,
``smollm2_135m_word_problems``): AdamW with warm-up and cosine decay, epoch-wise shuffling, batches
cut into passes of similar length, an optional early stop at a held-out accuracy, and resume points
(:mod:`creditlab_arith.resume`).

A training row is ``(token ids, number of masked prompt tokens, loss weight of its target tokens)``.
Everything runs on the CPU: warm starts are built once per machine and cached (or shipped).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from creditlab_arith import resume


def _batch(
    rows: list[tuple[list[int], int, float]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on prompt and pad), on the
    CPU: the warm-start recipes train there (a small model, built once and cached)."""
    width = max(len(row[0]) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(rows), width), dtype=torch.long, device="cpu")
    labels = torch.full((len(rows), width), -100, dtype=torch.long, device="cpu")
    for r, (seq, n_prompt, _) in enumerate(rows):
        ids[r, : len(seq)] = torch.tensor(seq, device="cpu")
        mask[r, : len(seq)] = 1
        labels[r, n_prompt : len(seq)] = torch.tensor(seq[n_prompt:], device="cpu")
    return ids, mask, labels


def split_by_length(rows: list[tuple[list[int], int, float]]) -> list[list[tuple[list[int], int, float]]]:
    """``rows`` as one or two groups of similar length, whichever pads less.

    The rows are sorted by length and cut where the padded area (rows x longest row, summed over
    the groups) is smallest; a cut is taken only if it saves at least a fifth of the area (a
    second pass has its own cost). Here it separates the short solutions from the longer
    localization examples, which would otherwise pad every solution to ~110 tokens.
    """
    rows = sorted(rows, key=lambda r: len(r[0]))
    n, lengths = len(rows), [len(r[0]) for r in rows]
    whole = n * lengths[-1]
    best, cut = whole, n
    for k in range(1, n):
        area = k * lengths[k - 1] + (n - k) * lengths[-1]
        if area < best:
            best, cut = area, k
    if best > 0.8 * whole:
        return [rows]
    return [rows[:cut], rows[cut:]]


def warm_start(
    model: torch.nn.Module, data: list[tuple[list[int], int, float]], pad_id: int, args: dict[str, Any],
    validate: Callable[[], float] | None = None, name: str = "arith_tiny",
) -> dict[str, Any]:
    """Supervised warm start: AdamW, linear warmup then cosine decay, epoch-wise shuffling.

    With ``validate`` (greedy pass@1 on held-out problems) and ``args["stop_at_pass1"]``, it stops
    at the first check that reaches that accuracy; checks come every ``validate_every`` steps,
    every 4 x ``validate_every`` while the last check was below half the target (the early steps,
    where the model learns the format and not yet the arithmetic).

    The loss of a batch is the weighted mean over its target tokens (each row's weight on each of
    its target tokens; all 1 unless ``localization_weight`` is set). A batch is run as one or two passes
    of rows of similar length (:func:`split_by_length`) whose summed token losses are divided by
    the batch's number of target tokens: the same loss and gradient as one padded pass, with
    less padding.

    With ``args["resume_path"]`` (a file) and ``args["save_every"]`` (steps), it writes a resume
    point there every ``save_every`` steps and, when one is there at the start, carries on from
    it (:mod:`creditlab_arith.resume`: the same weights as a run that never stopped); the caller
    deletes the file once the build is safe. ``info["resumed_at"]`` lists the steps it resumed after.
    """
    steps, bs = int(args["steps"]), int(args["batch_size"])
    opt = torch.optim.AdamW(
        model.parameters(), lr=args["lr"], weight_decay=args["weight_decay"], betas=(0.9, 0.98)
    )
    warm = max(1, int(args["warmup_steps"]))

    def schedule(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    gen = torch.Generator().manual_seed(int(args["seed"]))
    order: list[int] = []
    model.train()
    start, first, ema = time.time(), float("nan"), float("nan")
    target, every = args["stop_at_pass1"], int(args["validate_every"])
    head_on_targets = bool(args.get("head_on_targets", False))
    checks: list[tuple[int, float]] = []
    next_check, stopped, done, earlier, resumed_at = every, None, 0, 0.0, []
    resume_path, save_every = args.get("resume_path"), int(args.get("save_every") or 0)
    if (loop := resume.load(resume_path, model, opt, sched, gen, steps)) is not None:
        done, order, first, ema = loop["step"], loop["order"], loop["first"], loop["ema"]
        checks, next_check, earlier = loop["checks"], loop["next_check"], loop["seconds"]
        resumed_at = [*loop["resumed_at"], done]
    bar = _progress(steps, name, initial=done)
    for step in range(done, steps):
        if len(order) < bs:
            order += torch.randperm(len(data), generator=gen).tolist()
        idx, order = order[:bs], order[bs:]
        rows = [data[i] for i in idx]
        n_target = sum(w * (len(ids) - n_prompt) for ids, n_prompt, w in rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for part in split_by_length(rows):
            loss = _summed_loss(model, part, pad_id, head_on_targets)
            (loss / n_target).backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = total / n_target
        first = value if step == 0 else first
        ema = value if step == 0 else 0.95 * ema + 0.05 * value
        if validate is not None and step + 1 == next_check:
            checks.append((step + 1, validate()))
            next_check += every if checks[-1][1] >= target / 2 else 4 * every
            if checks[-1][1] >= target:
                stopped = step + 1
                bar(steps - 1, ema)  # closes the bar
                break
        bar(step, ema)
        if resume_path is not None and save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            resume.save(resume_path, model, opt, sched, gen, {
                "steps": steps, "step": step + 1, "order": order, "first": first, "ema": ema, "checks": checks,
                "next_check": next_check, "seconds": earlier + time.time() - start, "resumed_at": resumed_at})
    model.eval()
    seconds = earlier + time.time() - start
    ran = stopped or steps
    print(f"[{name}] warm start: {ran} steps in {seconds:.1f}s, loss {first:.3f} -> {ema:.3f}"
          + (f"; stopped at held-out greedy pass@1 {checks[-1][1]:.3f} >= {target}" if stopped else "")
          + (f"; never reached {target} (last check {checks[-1][1]:.3f})" if checks and not stopped else ""))
    info: dict[str, Any] = {"first_loss": first, "final_loss": ema, "seconds": seconds, "steps_run": ran}
    if resumed_at:
        info["resumed_at"] = resumed_at
    if validate is not None:
        info["validation"] = checks
    return info


def _summed_loss(model: Any, part: list[tuple[list[int], int, float]], pad_id: int, head_on_targets: bool) -> torch.Tensor:
    """The weighted sum of ``part``'s target-token losses (a scalar tensor).

    With ``head_on_targets`` the output layer runs on the target positions only (``model`` must
    have ``get_decoder()`` and ``get_output_embeddings()``, as Hugging Face causal LMs and PEFT
    wrappers do): the same losses up to the order of sums, without the vocabulary's logits on the
    prompt (two thirds of a word-problem row; about 1.25x faster per step, docs/real-problems.md).
    """
    ids, mask, labels = _batch(part, pad_id)  # (B, T) each
    labels = labels[:, 1:]  # (B, T-1): the token each position predicts
    if head_on_targets:
        keep = labels != -100
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
        logits = model.get_output_embeddings()(hidden[keep])  # (N targets, V)
        per_token = torch.nn.functional.cross_entropy(logits.float(), labels[keep], reduction="none")
        weights = torch.tensor([w for *_, w in part], device="cpu")[keep.nonzero()[:, 0]]
        return (per_token * weights).sum()
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # (B, T-1, V)
    flat = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if all(w == 1.0 for *_, w in part):  # the unweighted sum, as before weights existed
        return torch.nn.functional.cross_entropy(*flat, reduction="sum")
    per_token = torch.nn.functional.cross_entropy(*flat, reduction="none")
    weights = torch.tensor([w for *_, w in part], device="cpu").repeat_interleave(labels.shape[1])
    return (per_token * weights).sum()


def _progress(total: int, name: str = "arith_tiny", initial: int = 0) -> Any:
    """A callable ``(step, loss)`` that updates a progress bar (tqdm) or prints now and then;
    ``initial`` steps are already done (a resumed warm start)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with transformers
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, initial=initial, desc=f"{name} warm start", leave=False, mininterval=1.0)

        def update(step: int, loss: float) -> None:
            bar.update(1)
            if step % 20 == 0 or step == total - 1:
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if step == total - 1:
                bar.close()

        return update

    def fallback(step: int, loss: float) -> None:
        if step % max(1, total // 10) == 0 or step == total - 1:
            print(f"[{name}] step {step + 1}/{total} loss {loss:.3f}")

    return fallback
