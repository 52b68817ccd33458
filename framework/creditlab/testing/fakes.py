"""Fakes for testing parts without a model: random rollout batches and a scripted policy handle."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from creditlab.interfaces import PolicyHandle, check_frozen, offset_embeddings
from creditlab.step.rollout import collate
from creditlab.types import (
    Completion,
    GenerationRequest,
    Problem,
    RolloutBatch,
    SamplingParams,
    Trajectory,
)


def make_batch(
    groups: int = 3,
    group_size: int = 4,
    vocab: int = 32,
    max_len: int = 12,
    seed: int = 0,
    pad_id: int = 0,
    rewards: Sequence[float] | None = None,
    trainable_from: Sequence[int] | None = None,
    problems: Sequence[Problem] | None = None,
    texts: Sequence[str] | None = None,
) -> RolloutBatch:
    """A random, valid :class:`RolloutBatch` of ``groups * group_size`` rows.

    Response lengths vary in ``[1, max_len]``; token ids avoid ``pad_id``. ``rewards`` default to
    a seeded 0/1 draw (so most groups have mixed outcomes).
    """
    gen = torch.Generator().manual_seed(seed)
    n = groups * group_size
    if rewards is None:
        rewards = torch.randint(0, 2, (n,), generator=gen).float().tolist()
    trajectories = []
    for i in range(n):
        p_len = int(torch.randint(2, 6, (1,), generator=gen))
        r_len = int(torch.randint(1, max_len + 1, (1,), generator=gen))
        prompt = tuple(int(x) for x in torch.randint(1, vocab, (p_len,), generator=gen))
        resp = tuple(int(x) for x in torch.randint(1, vocab, (r_len,), generator=gen))
        if pad_id != 0:
            resp = tuple(x if x != pad_id else 1 for x in resp)
        start = 0 if trainable_from is None else min(trainable_from[i], r_len)
        logprobs = tuple(float(x) for x in -torch.rand(r_len - 0, generator=gen))
        text = texts[i] if texts is not None else ""
        completion = Completion(prompt, resp, logprobs, "eos", text)
        problem = problems[i // group_size] if problems is not None else Problem(f"p{i // group_size}", "q", "1")
        trajectories.append(Trajectory(problem, completion, float(rewards[i]), i // group_size, start))
    return collate(trajectories, pad_id)


def pad_batch(batch: RolloutBatch, extra: int, pad_id: int = 0) -> RolloutBatch:
    """The same batch with ``extra`` more right-padding columns."""
    b = batch.size

    def grow(x: torch.Tensor, fill: float) -> torch.Tensor:
        return torch.cat([x, torch.full((b, extra), fill, dtype=x.dtype)], dim=1)

    return replace(
        batch,
        input_ids=grow(batch.input_ids, pad_id),
        attention_mask=grow(batch.attention_mask, 0),
        response_ids=grow(batch.response_ids, pad_id),
        response_mask=grow(batch.response_mask, 0),
        loss_mask=grow(batch.loss_mask, 0),
        gen_logprobs=grow(batch.gen_logprobs, 0),
    )


class FakePolicyHandle(PolicyHandle):
    """A policy handle backed by a small model (any callable ``ids -> logits``) or by scripts.

    Args:
        logits_fn: ``(input_ids (B, L)) -> logits (B, L, V)``; a seeded random table by default.
        generate_fn: ``(requests, sampling) -> list[Completion]`` for parts that generate.
        tokenizer: Exposed as ``.tokenizer``.
        seed: Seeds ``.rng``.
        rollout_fn: ``(problems, requests) -> list[Trajectory]`` behind :meth:`rollouts`; by
            default each request gets one more token and a coin-flip reward drawn from ``.rng``.
    """

    def __init__(
        self,
        logits_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        generate_fn: Callable[[Sequence[GenerationRequest], SamplingParams], list[Completion]] | None = None,
        tokenizer: Any = None,
        seed: int = 0,
        vocab: int = 32,
        rollout_fn: Callable[..., list[Any]] | None = None,
    ) -> None:
        self.rollout_fn = rollout_fn
        table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1234))
        self.embedding = torch.nn.Embedding(vocab, 8)
        torch.nn.init.normal_(self.embedding.weight, generator=torch.Generator().manual_seed(99))
        self.logits_fn = logits_fn or (lambda ids: table[ids])
        self.generate_fn = generate_fn
        self._tokenizer = tokenizer
        self._rng = torch.Generator().manual_seed(seed)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def rng(self) -> torch.Generator:
        return self._rng

    def encode(self, text: str) -> tuple[int, ...]:
        if self._tokenizer is None:
            return tuple(1 + (ord(c) % 30) for c in text)
        return tuple(self._tokenizer(text)["input_ids"])

    @torch.no_grad()
    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logp = torch.log_softmax(self.logits_fn(input_ids).float(), dim=-1)
        out = torch.zeros(input_ids.shape)
        out[:, 1:] = logp[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return out * attention_mask * (1 if positions is None else positions.bool())

    def input_gradients(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        objective: Any,
        *,
        embedding_offset: torch.Tensor | None = None,
        read: torch.Tensor | None = None,
        frozen: int = 0,
    ):
        """Logits ``logits_fn(ids) + sum_d (E + embedding_offset)_d`` (at ``read`` only, when
        given); gradient w.r.t. clean E (0 in the ``frozen`` columns)."""
        check_frozen(input_ids, attention_mask, frozen, embedding_offset, read)
        emb = self.embedding(input_ids).detach().requires_grad_(True)
        with torch.enable_grad():
            inputs = offset_embeddings(emb, embedding_offset)
            logits = self.logits_fn(input_ids).float() + inputs.sum(-1, keepdim=True)
            if read is not None:
                logits = logits[read.bool()]
            (grad,) = torch.autograd.grad(objective(emb, logits), emb)
        if frozen:
            grad = grad.clone()  # the gradient of a sum may be an expanded view
            grad[:, :frozen] = 0
        return emb.detach(), grad.detach()

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Completion]:
        if self.generate_fn is None:
            raise RuntimeError("FakePolicyHandle was built without generate_fn")
        return self.generate_fn(requests, sampling)

    def rollouts(self, problems: Sequence[Any], requests: Sequence[GenerationRequest]) -> list[Any]:
        if self.rollout_fn is not None:
            return self.rollout_fn(problems, requests)
        coins = torch.randint(0, 2, (len(requests),), generator=self._rng).tolist()
        out = []
        for p, r, coin in zip(problems, requests, coins):
            ids = tuple(r.prefix_ids) + (1,)
            c = Completion(tuple(r.prompt_ids), ids, (0.0,), "eos", "", prefix_len=len(r.prefix_ids))
            out.append(Trajectory(p, c, float(coin), -1, len(r.prefix_ids)))
        return out


class FakeSampler:
    """A :data:`~creditlab.interfaces.SampleFn` without a model, for rollout strategy tests.

    Each request gets 1 to ``max_thoughts`` thoughts of ``thought_len`` random ids from ``vocab``,
    each ending with ``delimiter_ids``, after its prefix, and reward 1.0 with probability
    ``success_rate`` (else 0.0). Deterministic in ``(seed, position of the request in the call,
    its ids)``; ``calls`` and ``generated_tokens`` count what it sampled.
    """

    def __init__(
        self,
        vocab: Sequence[int] = tuple(range(1, 30)),
        delimiter_ids: Sequence[int] = (31,),
        success_rate: float = 0.5,
        max_thoughts: int = 4,
        thought_len: int = 3,
    ) -> None:
        self.vocab = torch.tensor(list(vocab))
        self.delimiter_ids = tuple(delimiter_ids)
        self.success_rate = success_rate
        self.max_thoughts = max_thoughts
        self.thought_len = thought_len
        self.calls = 0
        self.generated_tokens = 0

    def __call__(
        self, problems: Sequence[Problem], requests: Sequence[GenerationRequest], seed: int
    ) -> list[Trajectory]:
        self.calls += 1
        out = []
        for i, (problem, req) in enumerate(zip(problems, requests)):
            key = hash((seed, i, tuple(req.prompt_ids), tuple(req.prefix_ids))) % (2**62)
            gen = torch.Generator().manual_seed(key)
            ids: list[int] = []
            for _ in range(int(torch.randint(1, self.max_thoughts + 1, (1,), generator=gen))):
                pick = torch.randint(0, len(self.vocab), (self.thought_len,), generator=gen)
                ids += [int(x) for x in self.vocab[pick]] + list(self.delimiter_ids)
            reward = float(float(torch.rand(1, generator=gen)) < self.success_rate)
            response = tuple(req.prefix_ids) + tuple(ids)
            completion = Completion(
                tuple(req.prompt_ids), response, tuple(-0.5 for _ in ids), "eos", "",
                prefix_len=len(req.prefix_ids),
            )
            self.generated_tokens += len(ids)
            out.append(Trajectory(problem, completion, reward, -1, len(req.prefix_ids)))
        return out
