"""What a part may ask of the current policy (:class:`PolicyHandle`), without knowing Lightning or
the backend; the trained model's handle is :class:`creditlab.step.policy.ModelPolicyHandle`."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import torch

from creditlab.types import Completion, GenerationRequest, Problem, SamplingParams, Trajectory


def offset_embeddings(embeddings: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """``embeddings + offset`` (the offset cast to their dtype and device, not differentiated), or
    ``embeddings`` itself when ``offset`` is ``None``: the forward input of
    :meth:`PolicyHandle.input_gradients`.

    Raises:
        ValueError: ``offset`` does not have the shape of ``embeddings``.
    """
    if offset is None:
        return embeddings
    if offset.shape != embeddings.shape:
        raise ValueError(
            f"embedding_offset must have the embeddings' shape {tuple(embeddings.shape)}; "
            f"got {tuple(offset.shape)}"
        )
    return embeddings + offset.detach().to(embeddings)


def check_frozen(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, frozen: int, offset: torch.Tensor | None,
    read: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` unless ``frozen`` columns can be left out of
    :meth:`PolicyHandle.input_gradients`' gradient: ``0 <= frozen <= L``, and in those columns
    every token real, no offset and nothing read."""
    if not 0 <= frozen <= input_ids.shape[1]:
        raise ValueError(f"frozen must be in [0, {input_ids.shape[1]}] (the row width); got {frozen}")
    if not frozen:
        return
    if not bool((attention_mask[:, :frozen] > 0).all()):
        raise ValueError(f"frozen={frozen}: the first {frozen} columns must be real tokens in every row")
    if offset is not None and bool(offset[:, :frozen].any()):
        raise ValueError(f"frozen={frozen}: embedding_offset must be 0 in the first {frozen} columns")
    if read is not None and bool(read[:, :frozen].any()):
        raise ValueError(f"frozen={frozen}: nothing may be read in the first {frozen} columns")


def branch_sequences(
    input_ids: torch.Tensor, rows: torch.Tensor, at: torch.Tensor, branch_ids: torch.Tensor,
    branch_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both (J, W) long, right-padded: row j is ``input_ids[rows[j], :at[j]]``
    followed by the real tokens of ``branch_ids[j]`` (the whole sequences the default branch
    methods of :class:`PolicyHandle` run)."""
    seqs = [torch.cat([input_ids[rows[j], : at[j]], branch_ids[j][branch_mask[j] > 0]]) for j in range(len(rows))]
    width = max((len(x) for x in seqs), default=0)
    ids = torch.zeros((len(seqs), width), dtype=torch.long, device=input_ids.device)
    mask = torch.zeros_like(ids)
    for j, x in enumerate(seqs):
        ids[j, : len(x)], mask[j, : len(x)] = x, 1
    return ids, mask


class PolicyHandle(abc.ABC):
    """What a part may ask of the current policy, without knowing Lightning or the backend.

    Devices: the tensor methods take their inputs on any device (the handle moves them to the
    policy's once) and answer on the policy's device.

    Attributes:
        micro_batch_size: Rows a forward through the model may take at once (0: no bound).
        micro_batch_tokens: Padded tokens (rows x width) a forward with autograd through the
            model may take at once: the run's ``loss.micro_batch_tokens``, ``auto`` resolved
            (0: no bound). A part that differentiates through the model over many rows chunks
            its rows by both, as the update does.
    """

    micro_batch_size: int = 0
    micro_batch_tokens: int = 0

    @property
    @abc.abstractmethod
    def tokenizer(self) -> Any:
        """The policy's tokenizer (a ``transformers`` tokenizer)."""

    @property
    @abc.abstractmethod
    def rng(self) -> torch.Generator:
        """The step's random generator (deterministic in seed and step)."""

    @abc.abstractmethod
    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced next-token log-probs, no grad.

        Args:
            input_ids: (B, L) long.
            attention_mask: (B, L) long.
            positions: (B, L) bool, the entries wanted (e.g. a response's tokens), or None for
                every real token. A handle holding a large-vocabulary model computes only those
                (the LM head never sees the others).

        Returns:
            (B, L) float: entry ``[b, j]`` is log p(input_ids[b, j] | input_ids[b, :j]) where
            ``attention_mask`` (and ``positions``) are nonzero, else 0; column 0 is 0.
        """

    def branch_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rows: torch.Tensor,
        at: torch.Tensor,
        branch_ids: torch.Tensor,
        branch_mask: torch.Tensor,
        *,
        chunk: int = 0,
    ) -> torch.Tensor:
        """Teacher-forced log-probs of short continuations that branch off shared sequences, no grad.

        Branch ``j`` continues the first ``at[j]`` tokens of trunk ``rows[j]`` with
        ``branch_ids[j]`` (e.g. ``state + cue + answer`` rows that value many prefixes of one
        response by the probability of many answers). This default builds every
        ``trunk[:at] + branch`` sequence and calls :meth:`logprobs`; a handle holding the model may run each trunk once and branch
        from its KV cache (the same numbers up to float rounding).

        Args:
            input_ids: (B, L) long trunks, right-padded (real tokens first).
            attention_mask: (B, L) long.
            rows: (J,) long, the trunk of each branch.
            at: (J,) long, ``1 <= at[j] <=`` the real length of trunk ``rows[j]``.
            branch_ids: (J, M) long, right-padded.
            branch_mask: (J, M) long.
            chunk: Branches per forward at most, a memory bound (0: the handle's own choice).

        Returns:
            (J, M) float: ``[j, t] = log p(branch_ids[j, t] | trunk[:at[j]] + branch_ids[j, :t])``,
            0 where ``branch_mask`` is 0.
        """
        if len(rows) == 0:
            return torch.zeros(branch_ids.shape, dtype=torch.float32, device=branch_ids.device)
        ids, mask = branch_sequences(input_ids, rows, at, branch_ids, branch_mask)
        lp = self.logprobs(ids, mask)
        out = torch.zeros(branch_ids.shape, dtype=torch.float32, device=lp.device)
        for j in range(len(rows)):
            n = int(branch_mask[j].sum())
            out[j, :n] = lp[j, int(at[j]) : int(at[j]) + n].float()
        return out

    def read_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, read: torch.Tensor, *, frozen: int = 0
    ) -> torch.Tensor:
        """Raw next-token logits (temperature 1) at the positions ``read`` marks only, no grad.

        This default runs :meth:`input_gradients` with an objective whose backward does not enter
        the model; a handle holding the model runs a no-grad forward and sends only the read
        positions' hidden states through the LM head. ``frozen`` as in :meth:`input_gradients`
        (checked the same way): the first ``frozen`` columns hold prefixes that rows may share
        (a group's prompt), which the handle may run once per distinct prefix.

        Args:
            input_ids: (B, L) long.
            attention_mask: (B, L) long.
            read: (B, L) bool, the positions whose logits are wanted (position ``j``'s logits
                predict token ``j + 1``).

        Returns:
            (K, V) float32 (float64 from a float64 model), K = ``read.sum()``, the read positions
            in row-major order.
        """
        captured: list[torch.Tensor] = []

        def objective(embeddings: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            captured.append(logits.detach() if logits.dtype == torch.float64 else logits.detach().float())
            return (embeddings * 0).sum()

        self.input_gradients(input_ids, attention_mask, objective, read=read, frozen=frozen)
        return captured[0]

    def branch_read_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rows: torch.Tensor,
        at: torch.Tensor,
        branch_ids: torch.Tensor,
        branch_mask: torch.Tensor,
        read: torch.Tensor,
        *,
        chunk: int = 0,
    ) -> torch.Tensor:
        """:meth:`read_logits` of branches that continue shared trunks (the arguments of
        :meth:`branch_logprobs`): e.g. many copies of one sequence, each with one token replaced,
        read after the replacement. This default builds every ``trunk[:at] + branch`` sequence and
        calls :meth:`read_logits`; a handle holding the model may run each trunk once and branch
        from its KV cache (the same numbers up to float rounding).

        Args:
            read: (J, M) bool: ``read[j, t]`` asks for the logits after branch token ``t``, i.e.
                the distribution of the token following ``trunk[:at[j]] + branch_ids[j, :t + 1]``.
            chunk: As in :meth:`branch_logprobs`.

        Returns:
            (K, V) float32 (float64 from a float64 model), K = ``read.sum()``, in row-major order
            of ``read``.
        """
        ids, mask = branch_sequences(input_ids, rows, at, branch_ids, branch_mask)
        where = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        for j in range(len(rows)):  # branch column t sits at column at[j] + t of its sequence
            where[j, int(at[j]) + read[j].nonzero().flatten().to(ids.device)] = True
        return self.read_logits(ids, mask, where)

    @abc.abstractmethod
    def input_gradients(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        objective: Any,
        *,
        embedding_offset: torch.Tensor | None = None,
        read: torch.Tensor | None = None,
        frozen: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradient of a scalar objective with respect to the input embeddings.

        The forward runs on ``E + embedding_offset`` (``E`` = the embeddings of ``input_ids``);
        the objective and the returned gradient refer to the clean ``E``:
        ``d objective(E, logits(E + offset)) / dE``. Without an offset the forward is on ``E``.

        Args:
            input_ids: (B, L) long.
            attention_mask: (B, L) long.
            objective: Callable ``(embeddings (B, L, D), logits (B, L, V)) -> scalar`` built by
                the caller; ``embeddings`` is the clean ``E`` (requires grad; passed for
                reference), ``logits`` those of the forward on ``E + embedding_offset`` (with
                ``read``: only the read positions' logits, (K, V) in row-major order).
            embedding_offset: Optional (B, L, D) tensor added to the input embeddings before the
                forward (e.g. noise); cast to their dtype and device; not differentiated.
                ``None``: no offset.
            read: Optional (B, L) bool: hand the objective only these positions' logits, (K, V)
                with K = ``read.sum()`` (a handle holding a large-vocabulary model then never
                computes the others). ``None``: every position's, (B, L, V).
            frozen: The first ``frozen`` columns (real tokens in every row, no offset, nothing
                read there) whose gradient the caller does not need: it is returned as 0, and a
                handle holding the model may run each distinct prefix once, without grad, and
                continue from its KV cache (e.g. a prompt shared by many rows). 0: none.

        Returns:
            ``(embeddings, gradients)``, both (B, L, D), detached: the clean ``E`` and
            ``d objective / dE`` (0 in the ``frozen`` columns).

        Raises:
            ValueError: ``embedding_offset`` is not of shape (B, L, D), or ``frozen`` breaks
                its conditions (:func:`check_frozen`).
        """

    @abc.abstractmethod
    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Completion]:
        """Generate with the current policy (not trained on unless the caller says so)."""

    @abc.abstractmethod
    def encode(self, text: str) -> tuple[int, ...]:
        """Prompt text to token ids, as the backend would encode a problem prompt."""

    def rollouts(
        self, problems: Sequence[Problem], requests: Sequence[GenerationRequest]
    ) -> list[Trajectory]:
        """Continue each request with the run's rollout settings and score it with its verifier.

        ``requests[i]`` belongs to ``problems[i]``; plain or thought-by-thought generation as the
        run is configured, sampled with the step's generator: the :data:`SampleFn` the rollout
        strategy gets, seeded from :attr:`rng`. For value estimates and repairs; the results are
        not trained on unless the caller says so.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot sample and score rollouts")
