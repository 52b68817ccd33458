"""Outcome probes of OAR (Li et al., arXiv 2601.07408): their inputs and their read-outs.

The probe of a trajectory is ``prompt + reasoning + cue (+ answer)`` [code: the authors' fragment
builds ``token_ids_before_reasoning + token_ids_reasoning + token_ids_conclude (+ answer)``]:

* **marker** = the tokens holding the *last* occurrence of the ``answer_marker`` text in the
  decoded response (a final EOS excluded), found by :func:`find_marker`: the text is searched, and
  the character span mapped back to token positions, so a marker that BPE merged with its
  neighbours (``" \\"``, ``" $\\"`` before ``boxed``) is found as well. A token that holds marker
  characters belongs to the marker, even if it also holds a character before it (the space or
  ``$``). **answer** = the response tokens after the marker, up to the end; the marker and the
  answer keep advantage weight 1. **reasoning** = the response tokens before the marker. Without a
  marker every response token but a final EOS is reasoning. [ours: the fragment receives reasoning
  and answer as separate strings and re-tokenizes them; here the split is made on the decoded text
  but the pieces are the rollout's own token ids, never re-tokenized]
* **cue** = the ``cue`` text's tokens. With the default ``cue = answer_marker = "\\boxed{"`` the
  cue of a row with a marker is the rollout's own marker tokens, so the probe
  ``prompt + reasoning + cue + answer`` is exactly the rollout's own token sequence (minus EOS),
  merged tokens included. The fragment takes the cue from an input field (``inputs['conclude']``)
  whose value is not in the released code, so the default is ours.

Modes (what the probe reads):

* ``last`` [code]: the next-token distribution after the cue (logits at the cue's last position);
  the answer is not appended (causal models: it could not change that distribution).
* ``answer_mean`` [code, the fragment's default for the gradient variant]: the distribution of the
  *mean logits* over the positions that predict the answer tokens.
* ``answer_joint`` [code]: ``phi`` = mean log-prob of the answer tokens given the probe.

Rows whose answer is empty (no marker, or nothing after it) fall back from the answer modes to
``last`` (counted by the estimators).

Read-outs through :class:`~creditlab.interfaces.PolicyHandle` (OAR-G's noisy forward uses the
``embedding_offset`` keyword of ``input_gradients``):

* distributions: ``ctx.read_logits`` (no grad; logits at :func:`read_mask`'s positions only,
  never ``(N, L, V)``), :func:`mean_read_logits`; perturbed probes through
  ``ctx.branch_read_logits`` (each continues its clean probe's KV cache from the replaced token).
* ``phi``: :func:`answer_logprob` through ``ctx.logprobs`` (no grad; perturbed probes through
  ``ctx.branch_logprobs``). Note the handle applies the rollout temperature to these log-probs;
  the distributions above are raw logits (temperature 1, as the fragment). Both agree at
  ``rollout.temperature = 1``.
* OAR-G: ``ctx.input_gradients(..., read=read_mask(...))`` hands its objective the read
  positions' logits only, (K, V), gathered once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from creditlab import PolicyHandle, RolloutBatch

MODES = ("last", "answer_mean", "answer_joint")
#: Modes whose read-out is a distribution (compared by KL); ``answer_joint`` reads a scalar.
DIST_MODES = ("last", "answer_mean")


@dataclass(frozen=True)
class Probe:
    """The outcome probe of one batch row.

    Attributes:
        row: Batch row.
        ids: (N,) long, ``prompt + reasoning + cue (+ answer)``; ``N = cue_end + answer_len``.
        reasoning_start: Index in ``ids`` of reasoning token 0 (= the prompt length).
        n_reasoning: Reasoning tokens R; reasoning token k is response position k.
        scored: (L,) long, the trained reasoning positions (``loss_mask`` 1), ascending; the
            tokens whose importance is measured and reshaped.
        cue_end: Index just after the cue in ``ids``.
        answer_len: Answer tokens appended after the cue (0 in ``last`` mode).
        mode: The effective mode (``last`` after a fallback).
        marker_found: Whether the response holds the answer marker.
        fallback: An answer mode was asked for but the answer is empty.
    """

    row: int
    ids: torch.Tensor
    reasoning_start: int
    n_reasoning: int
    scored: torch.Tensor
    cue_end: int
    answer_len: int
    mode: str
    marker_found: bool
    fallback: bool

    @property
    def read_positions(self) -> list[int]:
        """Logit positions the probe reads: the cue's last token, or those predicting the answer."""
        if self.mode == "last":
            return [self.cue_end - 1]
        return list(range(self.cue_end - 1, self.cue_end - 1 + self.answer_len))


def text_ids(text: str, ctx: PolicyHandle) -> tuple[int, ...]:
    """Token ids of a cue or marker text: the tokenizer without special tokens, or, for a handle
    without tokenizer (test fakes), its ``encode``."""
    if not text:
        return ()
    tok = ctx.tokenizer
    if tok is None:
        return tuple(int(i) for i in ctx.encode(text))
    return tuple(int(i) for i in tok(text, add_special_tokens=False)["input_ids"])


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _first_token_reaching(tokenizer: Any, ids: Sequence[int], chars: int) -> int:
    """The smallest ``k`` whose prefix ``ids[:k + 1]`` decodes to more than ``chars`` characters
    (binary search: ``O(log n)`` decodes). ``len(ids)`` when none does."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_decode(tokenizer, ids[: mid + 1])) > chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def find_marker(
    body: Sequence[int], marker_ids: Sequence[int], marker_text: str = "", tokenizer: Any = None
) -> tuple[int, int] | None:
    """``(start, end)``: the token span ``body[start:end]`` holding the last answer marker, or
    ``None`` when the response has none.

    With a tokenizer and ``marker_text``, the marker is searched in the decoded text and its first
    and last characters are mapped back to the tokens that hold them (prefix decodes, binary
    search): a marker merged by BPE with the text around it (e.g. ``" \\"`` + ``"boxed"`` +
    ``"{"`` for ``" \\boxed{"``) is found, where its own encoding (``"\\"``, ``"boxed"``,
    ``"{"``) is not a subsequence of the response. The span is checked (its decoded text holds the
    marker); a tokenizer whose prefix decodes are not prefixes of the full decode (the check
    fails) falls back to the token sequence ``marker_ids``, as does a call without a tokenizer.
    """
    if tokenizer is not None and marker_text:
        text = _decode(tokenizer, body)
        at = text.rfind(marker_text)
        if at < 0:
            return None
        start = _first_token_reaching(tokenizer, body, at)
        end = _first_token_reaching(tokenizer, body, at + len(marker_text) - 1) + 1
        if start < end <= len(body) and marker_text in _decode(tokenizer, body[start:end]):
            return start, end
    m = last_occurrence(body, marker_ids)
    return None if m is None else (m, m + len(marker_ids))


def last_occurrence(seq: Sequence[int], pattern: Sequence[int]) -> int | None:
    """Start of the last occurrence of ``pattern`` in ``seq`` (``None`` if absent or empty)."""
    k = len(pattern)
    if k == 0 or k > len(seq):
        return None
    pat = list(pattern)
    for start in range(len(seq) - k, -1, -1):
        if seq[start] == pat[0] and list(seq[start : start + k]) == pat:
            return start
    return None


def build_probe(
    batch: RolloutBatch,
    row: int,
    marker_ids: Sequence[int],
    cue_ids: Sequence[int],
    mode: str,
    eos_id: int | None,
    marker_text: str = "",
    tokenizer: Any = None,
    cue_is_marker: bool = False,
) -> Probe:
    """The probe of ``batch`` row ``row``.

    Args:
        batch: The rollout batch (``input_ids`` (B, P+T), ``attention_mask``, ``response_ids``
            (B, T), ``response_mask``, ``loss_mask``).
        row: Batch row.
        marker_ids: Answer-marker token ids (the match without a tokenizer).
        cue_ids: Conclude-cue token ids.
        mode: One of :data:`MODES`.
        eos_id: The tokenizer's EOS id, or ``None`` (then a row that finished with ``"eos"`` is
            taken to end in its EOS token, as backends keep it in ``response_ids``).
        marker_text: Answer-marker text, searched in the decoded response (:func:`find_marker`).
        tokenizer: Decodes the response for that search; ``None``: match ``marker_ids``.
        cue_is_marker: The cue is the marker text: a row with a marker takes its own marker
            tokens as the cue (its probe is then its own token sequence).
    """
    p = batch.prompt_len
    prompt = batch.input_ids[row, :p][batch.attention_mask[row, :p] > 0]
    n = int(batch.response_mask[row].sum())
    resp = batch.response_ids[row, :n]
    finish = batch.trajectories[row].completion.finish_reason if batch.trajectories else ""
    if n and finish == "eos" and (eos_id is None or int(resp[-1]) == eos_id):
        n -= 1
    body = resp[:n].tolist()
    span = find_marker(body, marker_ids, marker_text, tokenizer)
    reasoning_end = n if span is None else span[0]
    answer = resp[span[1] : n] if span is not None else resp[:0]
    eff, fallback = mode, False
    if mode != "last" and answer.numel() == 0:
        eff, fallback = "last", True
    if cue_is_marker and span is not None:
        cue_ids = body[span[0] : span[1]]
    cue = torch.tensor(list(cue_ids), dtype=torch.long, device=prompt.device)
    parts = [prompt, resp[:reasoning_end], cue] + ([answer] if eff != "last" else [])
    ids = torch.cat(parts).long()
    trained = batch.loss_mask[row, :reasoning_end] > 0
    return Probe(
        row=row,
        ids=ids,
        reasoning_start=int(prompt.numel()),
        n_reasoning=reasoning_end,
        scored=torch.nonzero(trained).flatten(),
        cue_end=int(prompt.numel()) + reasoning_end + len(cue_ids),
        answer_len=int(answer.numel()) if eff != "last" else 0,
        mode=eff,
        marker_found=span is not None,
        fallback=fallback,
    )


def pad_right(seqs: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D id tensors.

    Returns:
        ``(input_ids, attention_mask)``, both (N, max length) long.
    """
    width = max(int(s.numel()) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=seqs[0].device)
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device=seqs[0].device)
    for j, s in enumerate(seqs):
        ids[j, : s.numel()] = s
        mask[j, : s.numel()] = 1
    return ids, mask


def read_mask(probes: Sequence[Probe], width: int) -> torch.Tensor:
    """(N, width) bool: row j marks ``probes[j].read_positions`` (the rows right-padded to
    ``width``), the positions :meth:`~creditlab.interfaces.PolicyHandle.read_logits` returns."""
    read = torch.zeros((len(probes), width), dtype=torch.bool, device="cpu")
    for j, p in enumerate(probes):
        read[j, p.read_positions] = True
    return read


def per_probe(logits: torch.Tensor, probes: Sequence[Probe]) -> list[torch.Tensor]:
    """The packed read-out logits (K, V), K = the probes' read positions in order, split into one
    (K_j, V) view per probe."""
    return list(torch.split(logits, [len(p.read_positions) for p in probes]))


def mean_read_logits(
    ctx: PolicyHandle, input_ids: torch.Tensor, attention_mask: torch.Tensor, probes: Sequence[Probe]
) -> torch.Tensor:
    """Mean raw logits over each probe's read positions, no grad (``ctx.read_logits``: logits at
    those positions only).

    Args:
        input_ids: (N, L) long, row j = ``probes[j].ids`` right-padded.
        attention_mask: (N, L) long.

    Returns:
        (N, V) float64 (detached, CPU).
    """
    # the prompts are read nowhere: the handle may run each once (a group shares it)
    logits = ctx.read_logits(input_ids, attention_mask, read_mask(probes, input_ids.shape[1]),
                             frozen=min(p.reasoning_start for p in probes))
    return torch.stack([z.double().mean(0) for z in per_probe(logits, probes)]).cpu()


def answer_logprob(
    ctx: PolicyHandle,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    starts: Sequence[int],
    lengths: Sequence[int],
) -> torch.Tensor:
    """``phi``: mean log-prob of each row's answer tokens ``input_ids[j, start : start + length]``.

    Returns:
        (N,) float64.
    """
    cols = torch.arange(input_ids.shape[1], device="cpu")[None]
    start = torch.tensor(list(starts), device="cpu")[:, None]
    length = torch.tensor(list(lengths), dtype=torch.float64, device="cpu")
    sel = (cols >= start) & (cols < start + length[:, None].long())  # (N, L): the answer tokens
    lp = ctx.logprobs(input_ids, attention_mask, sel.to(input_ids.device)).double().cpu()  # (N, L)
    return (lp * sel).sum(1) / length.clamp(min=1)


def kl_from_logits(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """``KL(P || Q)`` per row from logits (N, V); float64, clamped at 0 (rounding)."""
    lp = torch.log_softmax(p_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1).clamp(min=0.0)


def probe_readout(logits: torch.Tensor, probes: Sequence[Probe]) -> list[torch.Tensor]:
    """What each probe reads, differentiable: for ``last``/``answer_mean`` the mean logits over
    :attr:`Probe.read_positions` ((V,) float64), for ``answer_joint`` ``phi`` (a float64 scalar).

    Args:
        logits: (K, V), the read positions' logits of all probes in order (:func:`read_mask`;
            one gather, so the backward allocates one gradient of this size).
        probes: N probes.
    """
    out = []
    for pr, z in zip(probes, per_probe(logits, probes)):
        rows = z.double()  # (K_j, V)
        if pr.mode in DIST_MODES:
            out.append(rows.mean(0))
        else:
            target = pr.ids[pr.cue_end : pr.cue_end + pr.answer_len].to(logits.device)
            out.append(torch.log_softmax(rows, -1).gather(-1, target[:, None]).mean())
    return out


def probe_divergence(
    logits: torch.Tensor, probes: Sequence[Probe], teachers: Sequence[torch.Tensor | None]
) -> torch.Tensor:
    """Differentiable ``J`` of OAR-G per row, at the (noisy) ``logits`` against clean teachers.

    ``last``/``answer_mean``: ``J = KL(P0 || P)``, ``P0 = softmax(teachers[j])`` (the clean mean
    logits of :func:`probe_readout`, no grad), ``P`` from ``logits``. ``answer_joint``:
    ``J = -phi``, i.e. ``phi0 - phi`` up to the constant ``phi0``, which does not change the
    gradient and is not needed (``teachers[j]`` is ignored, may be ``None``).

    Args:
        logits: (K, V), the read positions' logits of all probes in order (:func:`read_mask`).
        probes: N probes.
        teachers: N entries: (V,) clean mean logits for the distribution modes.

    Returns:
        (N,) float64.
    """
    out = []
    for pr, read, teacher in zip(probes, probe_readout(logits, probes), teachers):
        if pr.mode in DIST_MODES:
            logq = torch.log_softmax(read, -1)
            logp0 = torch.log_softmax(teacher.detach().double().to(read.device), -1)
            out.append((logp0.exp() * (logp0 - logq)).sum())
        else:
            out.append(-read)
    return torch.stack(out)
