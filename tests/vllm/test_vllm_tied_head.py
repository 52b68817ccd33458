"""A tied head (SmolLM2 ties its output head to its input embedding) reaches the vLLM engine at
every weight sync. Its own module: its engine runs in this process, and two in-process engines
must not overlap (closing one tears down the distributed state the other uses)."""

from __future__ import annotations

import torch
from creditlab.backends.hf import HFBackend

from tests.helpers import tiny_model_and_tokenizer
from tests.vllm.conftest import MARKS, small_engine
from tests.vllm.test_vllm_backend import _greedy, _reqs, _same

pytestmark = MARKS


def test_a_tied_head_reaches_the_engine_at_every_sync():
    """SmolLM2 ties its head to its embedding. vLLM 0.32's reload does not re-tie the head from
    the embedding (left out, it stays stale: tried), so every sync sends the shared tensor under
    both names, and the engine samples what HF samples after a step that moved it."""
    model, tok = tiny_model_and_tokenizer(seed=2, hidden=64, heads=2, tied=True)
    vb, hb = small_engine(model, tok), HFBackend(model=model, tokenizer=tok)
    reqs = _reqs(tok)
    try:
        for v, h in zip(_greedy(vb, reqs), _greedy(hb, reqs)):
            _same(v, h)
        with torch.no_grad():
            g = torch.Generator().manual_seed(9)
            for p in model.parameters():  # the embedding, and so the head, too
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        vb.metrics()
        vb.load_weights(None)
        sent = model.state_dict()  # the shared tensor under both names
        assert sent["lm_head.weight"].data_ptr() == sent["model.embed_tokens.weight"].data_ptr()
        assert vb.metrics()["sync_bytes"] == 4 * sum(t.numel() for t in sent.values())
        for v, h in zip(_greedy(vb, reqs), _greedy(hb, reqs)):
            _same(v, h)
    finally:
        vb.close()
