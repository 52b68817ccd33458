"""The vLLM backend's tests: marker ``vllm``, run in .venv-vllm by ``make test-vllm``; skipped
wherever vLLM is not installed (the main venv). One engine per test module (it takes 35-60 s to
start on 2 shared cores); vLLM spawns its processes, which pytest's entry point allows."""

import pytest
from creditlab.backends.vllm import VLLMBackend, vllm_available

from tests.helpers import tiny_model_and_tokenizer

SKIP = pytest.mark.skipif(not vllm_available(), reason="vLLM not installed (make test-vllm)")
MARKS = [pytest.mark.vllm, SKIP]


def tiny_pair(seed: int = 0):
    """A tiny Llama whose head size (64 / 2 = 32) vLLM's CPU attention supports, and its char
    tokenizer. (The helpers' default, 4 heads of 16, is not supported.)"""
    return tiny_model_and_tokenizer(seed=seed, hidden=64, heads=2)


def small_engine(model, tok) -> VLLMBackend:
    """A vLLM backend with a small KV cache and context (the engine starts on first use)."""
    config = VLLMBackend.Config(kv_cache_gib=0.25, max_model_len=512, max_num_seqs=64)
    return VLLMBackend(config, model=model, tokenizer=tok)
