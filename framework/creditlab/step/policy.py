"""The :class:`~creditlab.interfaces.PolicyHandle` parts use to reach the trained model, and the
plain helpers around it (prompt encoding, positions, a padded forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from creditlab.errors import ConfigError
from creditlab.interfaces import GenerationBackend, PolicyHandle, check_frozen, offset_embeddings
from creditlab.step.forward import CACHE_KEY, branch_logits, position_ids, prefix_cache, response_hidden
from creditlab.step.losses import gather_logprobs
from creditlab.step.token_logprobs import fused_head_of, select_logprobs
from creditlab.types import Completion, GenerationRequest, Problem, SamplingParams, Trajectory


def encode_prompt(
    tokenizer: Any, text: str, chat_template: bool | str = "auto", where: str = "rollout.chat_template"
) -> tuple[int, ...]:
    """Prompt text to ids: a user turn of the tokenizer's chat template with the generation prompt,
    or the plain text with the tokenizer's special tokens (``add_special_tokens=True``).

    Args:
        tokenizer: A ``transformers`` tokenizer.
        text: The prompt.
        chat_template: ``"auto"`` (the template when the tokenizer has one; the default, and what
            every prompt got before this was a setting), ``True`` (the template; the tokenizer must
            have one) or ``False`` (the plain text, for prompts written as a raw
            completion).
        where: The setting named in errors.

    Raises:
        ConfigError: ``chat_template`` is none of those, or ``True`` with a tokenizer that has no
            chat template.
    """
    if not (chat_template == "auto" or isinstance(chat_template, bool)):
        raise ConfigError(f"{where} must be auto, true or false; got {chat_template!r}.")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat_template is True and not has_template:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"{where}=true but the tokenizer of {name} has no chat template; set {where} to auto "
            "(template when there is one) or false (plain text)."
        )
    if has_template and chat_template is not False:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return tuple(int(i) for i in ids)
    return tuple(tokenizer(text, add_special_tokens=True)["input_ids"])


def forward_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, V) logits of a left/right padded batch."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
    )
    return out.logits


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def read_head(
    model: Any, fused: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
    read: torch.Tensor, inputs_embeds: torch.Tensor | None = None, frozen: int = 0,
) -> torch.Tensor:
    """(K, V) logits at the K positions ``read`` (B, L) bool marks, row-major, in the model's
    dtype, differentiable when grad is on: the decoder's hidden states at those positions only
    through the LM head where it can be fused (``fused`` = ``loss.fused_head``,
    :func:`~creditlab.step.token_logprobs.fused_head_of`), else the full (B, L, V) logits indexed
    once. Input: ``input_ids`` (B, L), or ``inputs_embeds`` (B, L, D) when given. With ``frozen``
    (checked by the caller, :func:`~creditlab.interfaces.check_frozen`): each distinct prefix of
    ``input_ids``' first ``frozen`` columns runs once without grad
    (:func:`~creditlab.step.forward.prefix_cache`) and the rest continue from its cache, when the
    model allows it; else the whole rows run."""
    head = fused_head_of(model, fused)
    cache = None
    if frozen:
        cache = prefix_cache(model, input_ids[:, :frozen], attention_mask[:, :frozen], None if head is None else head[0])
    s = frozen if cache is not None else 0  # the columns the cache holds
    inputs = {"input_ids": input_ids[:, s:]} if inputs_embeds is None else {"inputs_embeds": inputs_embeds[:, s:]}
    kwargs = {"attention_mask": attention_mask, "position_ids": position_ids(attention_mask)[:, s:],
              "use_cache": cache is not None}
    if cache is not None:
        kwargs[CACHE_KEY] = cache
    if head is None:
        return model(**inputs, **kwargs).logits[read[:, s:]]
    decoder, weight, bias = head
    hidden = decoder(**inputs, **kwargs).last_hidden_state
    return torch.nn.functional.linear(hidden[read[:, s:]], weight, bias)


class ModelPolicyHandle(PolicyHandle):
    """The current policy as parts see it: the trained module, its tokenizer and the backend.

    Args:
        model: The policy (``transformers`` causal LM).
        tokenizer: Its tokenizer.
        backend: The generation backend.
        rng: The step's generator.
        temperature: Sampling temperature of training rollouts (log-probs use it).
        micro_batch_size: Rows per forward pass in :meth:`logprobs` (0 = all at once).
        micro_batch_tokens: Padded tokens per forward with autograd (``loss.micro_batch_tokens``
            resolved; 0 = no bound), for the parts that chunk :meth:`input_gradients` by it.
        rollout_fn: The run's :data:`~creditlab.interfaces.SampleFn` (its
            :class:`~creditlab.step.rollout.RolloutSampler`), behind :meth:`rollouts`.
        chat_template: How :meth:`encode` encodes problem prompts (``rollout.chat_template``:
            ``auto``, ``True`` or ``False``; :func:`encode_prompt`), so every part encodes a
            problem as the rollouts and the evaluation do.
        fused_head: ``loss.fused_head``: how :meth:`logprobs` and :meth:`branch_logprobs` reach
            log-probs (:mod:`creditlab.step.token_logprobs`).

    ``generated_tokens`` counts the tokens of :meth:`generate` calls (e.g. a reset selector's
    questions; :meth:`rollouts` are counted by the sampler) so runs compare on all generated tokens.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        backend: GenerationBackend,
        rng: torch.Generator,
        temperature: float = 1.0,
        micro_batch_size: int = 0,
        rollout_fn: Any = None,
        chat_template: bool | str = "auto",
        fused_head: str = "auto",
        micro_batch_tokens: int = 0,
    ) -> None:
        self.model = model
        self.fused_head = fused_head
        self.chat_template = chat_template
        self.rollout_fn = rollout_fn
        self.generated_tokens = 0
        self._tokenizer = tokenizer
        self.backend = backend
        self._rng = rng
        self.temperature = temperature if temperature > 0 else 1.0
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def rng(self) -> torch.Generator:
        return self._rng

    def encode(self, text: str) -> tuple[int, ...]:
        return encode_prompt(self._tokenizer, text, self.chat_template)

    @property
    def device(self) -> torch.device:
        """The policy's device: every tensor the handle is given is moved there once."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Through the fused LM head at the wanted positions only, where the model allows
        (:mod:`creditlab.step.token_logprobs`); else from the full logits."""
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        want = attention_mask.bool() if positions is None else attention_mask.bool() & positions.to(self.device).bool()
        head = fused_head_of(self.model, self.fused_head)
        step = self.micro_batch_size or input_ids.shape[0]
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        for s in range(0, input_ids.shape[0], step):
            ids, mask = input_ids[s : s + step], attention_mask[s : s + step]
            if head is None:
                logits = forward_logits(self.model, ids, mask)[:, :-1].float()
                out[s : s + step, 1:] = gather_logprobs(logits, ids[:, 1:], self.temperature)
            else:  # the hidden states predicting columns 1.., through the head where wanted
                hidden = response_hidden(self.model, head[0], ids, mask, 1, share_prompts=False)
                out[s : s + step, 1:] = select_logprobs(
                    hidden, head[1], head[2], ids[:, 1:], want[s : s + step, 1:], self.temperature)[0]
        return out * want

    @torch.no_grad()
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
        """Each trunk runs once; branches continue from its KV cache
        (:func:`creditlab.step.forward.branch_logits`), or the plain default when the model's cache
        cannot be shared."""
        input_ids, attention_mask, rows, at, branch_ids, branch_mask = (
            x.to(self.device) for x in (input_ids, attention_mask, rows, at, branch_ids, branch_mask))
        if len(rows):
            head = fused_head_of(self.model, self.fused_head)
            states = branch_logits(
                self.model, input_ids, attention_mask, rows, at, branch_ids, branch_mask,
                chunk=chunk or self.micro_batch_size, decoder=None if head is None else head[0],
            )
            if states is not None and head is not None:
                return select_logprobs(
                    states, head[1], head[2], branch_ids, branch_mask.bool(), self.temperature)[0]
            if states is not None:
                return gather_logprobs(states, branch_ids, self.temperature) * branch_mask
        return super().branch_logprobs(input_ids, attention_mask, rows, at, branch_ids, branch_mask)

    @torch.no_grad()
    def read_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, read: torch.Tensor, *, frozen: int = 0
    ) -> torch.Tensor:
        """A no-grad forward up to the last read column; only the read positions' hidden states
        reach the LM head where it can be fused (:func:`read_head`), ``micro_batch_size`` rows at
        a time. With ``frozen``, each distinct prefix of a micro-batch runs once
        (:func:`~creditlab.step.forward.prefix_cache`) when the model allows it."""
        input_ids, attention_mask, read = (x.to(self.device) for x in (input_ids, attention_mask, read))
        read = read.bool()
        check_frozen(input_ids, attention_mask, frozen, None, read)
        width = int(read.any(0).nonzero().max()) + 1 if read.any() else 0
        step = self.micro_batch_size or max(input_ids.shape[0], 1)
        outs = [torch.zeros((0, 0), device=self.device)]
        for s in range(0, input_ids.shape[0], step):
            ids, mask, want = (x[s : s + step, :width] for x in (input_ids, attention_mask, read))
            if want.any():
                outs.append(_at_least_fp32(read_head(self.model, self.fused_head, ids, mask, want, frozen=frozen)))
        return torch.cat(outs[1:]) if len(outs) > 1 else outs[0]

    @torch.no_grad()
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
        """Each trunk runs once; branches continue from its KV cache and only the read positions'
        hidden states reach the LM head (the default when the cache cannot be shared)."""
        input_ids, attention_mask, rows, at, branch_ids, branch_mask, read = (
            x.to(self.device) for x in (input_ids, attention_mask, rows, at, branch_ids, branch_mask, read))
        head = fused_head_of(self.model, self.fused_head)
        states = None
        if len(rows):
            states = branch_logits(
                self.model, input_ids, attention_mask, rows, at, branch_ids, branch_mask,
                chunk=chunk or self.micro_batch_size, decoder=None if head is None else head[0], after_each=True,
            )
        if states is None:
            return super().branch_read_logits(input_ids, attention_mask, rows, at, branch_ids, branch_mask, read)
        picked = states[read.bool()]
        return _at_least_fp32(picked if head is None else torch.nn.functional.linear(picked, head[1], head[2]))

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
        """With ``frozen`` and ``read``: the first ``frozen`` columns run once per distinct prefix
        without grad (:func:`~creditlab.step.forward.prefix_cache`) and the rest continue from
        their cache, when the model allows it."""
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        if embedding_offset is not None:
            embedding_offset = embedding_offset.to(self.device)
        check_frozen(input_ids, attention_mask, frozen, embedding_offset, read)
        embeddings = self.model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
        with torch.enable_grad():
            inputs = offset_embeddings(embeddings, embedding_offset)
            if read is None:
                logits = self.model(
                    inputs_embeds=inputs, attention_mask=attention_mask,
                    position_ids=position_ids(attention_mask), use_cache=False,
                ).logits
            else:
                logits = read_head(self.model, self.fused_head, input_ids, attention_mask,
                                   read.to(self.device).bool(), inputs_embeds=inputs, frozen=frozen)
            value = objective(embeddings, logits)
            (grad,) = torch.autograd.grad(value, embeddings)
        if frozen:
            grad = grad.clone()  # the contract's 0, whichever path ran (a gradient may be an expanded view)
            grad[:, :frozen] = 0
        return embeddings.detach(), grad.detach()

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Completion]:
        out = self.backend.generate(requests, sampling)
        self.generated_tokens += sum(len(c.logprobs) for c in out)
        return out

    def rollouts(
        self, problems: Sequence[Problem], requests: Sequence[GenerationRequest]
    ) -> list[Trajectory]:
        if self.rollout_fn is None:
            return super().rollouts(problems, requests)
        seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
        return self.rollout_fn(problems, requests, seed)
