"""Tiny local model and tokenizer for tests (no hub access, builds in well under a second).

Usage::

    from tests.helpers import char_tokenizer, tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()            # 2 layers, hidden 64, random init
    model, tok = tiny_model_and_tokenizer(tmp_path)    # also save_pretrained() into tmp_path
    ids = tok.encode("1+2=", add_special_tokens=False) # one id per character

The tokenizer is character level: every character of :data:`CHARS` (``string.printable``) is one
token, and ``</thought>`` is one added (non-special) token, so it survives
``decode(..., skip_special_tokens=True)``. Special tokens: ``<pad>`` (id 0), ``<eos>`` (1),
``<bos>`` (2), ``<unk>`` (3); ``</thought>`` is id 4. No BOS/EOS is added on ``encode``.
Decoding round-trips text exactly.

:func:`write_dist` lays out an installed distribution (``*.dist-info`` with entry points) in a
folder, for plug-in discovery tests.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import string
import sys
import textwrap
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Characters that are one token each.
CHARS: str = string.printable
#: Special tokens in id order; ``THOUGHT`` follows them as a normal added token.
SPECIALS: tuple[str, ...] = ("<pad>", "<eos>", "<bos>", "<unk>")
THOUGHT: str = "</thought>"


def char_tokenizer(chars: str = CHARS):
    """A character-level ``PreTrainedTokenizerFast``.

    Args:
        chars: Characters that get one token each (after the special tokens and ``</thought>``).

    Returns:
        The tokenizer, with pad/eos/bos/unk set; ``len(tok) == 5 + len(chars)``.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIALS, THOUGHT))}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    core.add_tokens([AddedToken(THOUGHT, normalized=False, special=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def tiny_model_and_tokenizer(
    tmp_path: str | Path | None = None,
    seed: int = 0,
    *,
    num_layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    init_std: float = 0.1,
    max_positions: int = 2048,
    tied: bool = False,
):
    """A randomly initialised tiny ``LlamaForCausalLM`` and its char-level tokenizer.

    Args:
        tmp_path: When given, both are saved there with ``save_pretrained`` (so
            ``AutoModelForCausalLM.from_pretrained(tmp_path)`` works offline).
        seed: Seed of the weight initialisation (same seed => same weights).
        num_layers: Decoder layers.
        hidden: Hidden size.
        heads: Attention heads.
        kv_heads: Key-value heads (default ``heads // 2``, grouped-query attention).
        intermediate: MLP width (default ``2 * hidden``).
        init_std: Init std of the weights; 0.1 (larger than Llama's 0.02) gives peaked logits, so
            greedy decoding has few near-ties.
        max_positions: ``max_position_embeddings``.
        tied: Tie the output head to the input embedding (``tie_word_embeddings``, as SmolLM2).

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, fp32, on CPU.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or max(1, heads // 2),
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    if tmp_path is not None:
        model.save_pretrained(tmp_path)
        tok.save_pretrained(tmp_path)
    return model, tok


def with_token_bias(model, biases: dict[int, float]):
    """A deep copy of ``model`` whose output logits get a constant bias per token id.

    Useful to make a random model emit a token (``<eos>``, ``</thought>``) often, while keeping
    a plain ``transformers`` model (teacher forcing through ``model(...)`` stays consistent).

    Args:
        model: A causal LM with an ``lm_head`` ``nn.Linear``.
        biases: ``{token_id: added_logit}``.
    """
    import copy

    new = copy.deepcopy(model)
    old = new.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        for token_id, value in biases.items():
            head.bias[token_id] = value
    new.lm_head = head
    return new


def write_dist(
    root: str | Path,
    name: str,
    entry_points: dict[str, dict[str, str]],
    modules: dict[str, str] | None = None,
    version: str = "1.2.3",
) -> None:
    """Lay out an installed distribution in ``root`` as pip would (no build, no install).

    Args:
        root: A folder that is (or will be) on ``sys.path``/``PYTHONPATH``.
        name: Distribution name (``METADATA`` ``Name``).
        entry_points: ``{group: {name: "module:attr"}}`` written to ``entry_points.txt``.
        modules: ``{relative path: source}`` files written under ``root`` (dedented).
        version: Distribution version.
    """
    root = Path(root)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for rel, source in (modules or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


def check_finished_run(run_dir: str | Path, steps: int) -> list[dict]:
    """Assert the run in ``run_dir`` finished and logged training steps ``1..steps`` (with loss and
    gradient norm) and only finite numbers; returns its metrics.jsonl rows."""
    run_dir = Path(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "finished", status
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train/reward/mean" in r]
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    assert all("train/loss" in r and "train/grad_norm" in r for r in train)
    bad = [(r["step"], k) for r in rows for k, v in r.items()
           if not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))]
    assert not bad, f"non-finite or non-numeric metrics: {bad[:5]}"
    return rows


#: The repository's root (benchmarks/ and sweeps/ hold scripts, not packages).
ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """The module of the script at ``ROOT / relative`` (e.g. ``"sweeps/blame_share.py"``),
    executed once under its file name, so tests call its functions directly. It is registered in
    ``sys.modules`` under that name, as an import would be (dataclasses look their module up there)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


#: Metrics that measure time, not training: dropped before comparing runs for equality.
VOLATILE_PREFIXES = ("wall", "time/")
DURATION_SUFFIXES = ("_s", "seconds", "per_s")  # e.g. train/backend/seconds, .../tokens_per_s


def stable(rows) -> list[dict]:
    """``rows`` of metrics.jsonl without wall-clock metrics, for run-equality checks."""
    return [
        {k: v for k, v in r.items() if not k.startswith(VOLATILE_PREFIXES) and not k.endswith(DURATION_SUFFIXES)}
        for r in rows
    ]


def recompare(results: Path, out_dir: Path) -> dict:
    """``creditlab compare`` on a committed results file alone, written to ``out_dir``: its
    ``compare.json``, from which a card's table is checked."""
    from creditlab.cli.compare_command import main as compare

    compare([str(results), "--out", str(out_dir)])
    return json.loads((out_dir / "compare.json").read_text())


def final_accuracies(results) -> dict:
    """``{run name: (step, eval/sample_accuracy)}`` at each run's last evaluation, read from a
    committed ``creditlab compare`` results file (``results.jsonl.gz``)."""
    runs = {}
    for line in gzip.open(results, "rt"):
        run = json.loads(line)
        last = [json.loads(x) for x in run["files"]["metrics.jsonl"].splitlines() if "eval/sample_accuracy" in x][-1]
        runs[run["name"]] = (last["step"], last["eval/sample_accuracy"])
    return runs


def paired_outcomes(before: list[int], after: list[int]) -> tuple[int, int, float, float, float, float]:
    """Two 0/1 outcome lists of the same problems: ``(gained, lost, mean difference, low, high,
    p)``, with the paired difference's 95% Wald interval (sample sd over ``n - 1``) and the exact
    two-sided McNemar p (a binomial test on the problems whose outcome changed). For the committed
    per-problem results that tests recompute."""
    from scipy import stats

    d = [b - a for a, b in zip(before, after, strict=True)]
    n = len(d)
    gained, lost = d.count(1), d.count(-1)
    mean = sum(d) / n
    half = 1.959964 * math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)
    p = stats.binomtest(gained, gained + lost).pvalue if gained + lost else 1.0
    return gained, lost, mean, mean - half, mean + half, p
