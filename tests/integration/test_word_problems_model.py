"""The shipped word-problem warm start (``model=smollm2_135m_word_problems``, issue 53): the
adapter's verified bytes merge into the same model bytes on every machine (float64, elementwise,
a fixed order), and ``creditlab eval`` scores it offline on a user's file with both lines.

One base conversion and one merge per session (about a minute on 2 cores)."""

import json
from pathlib import Path

import pytest
from creditlab.cli import main
from creditlab_smollm2 import word_problems as wp

pytestmark = pytest.mark.slow

#: The merged weights' sha256 (names and fp32 bytes of every tensor, in name order) as the build
#: that produced the shipped adapter recorded it.
MERGED_SHA256 = "5b77447299d420159c232e763d7a280d82417b763c8b59d56aa44c51614e8b26"


def test_the_shipped_adapter_merges_into_the_recorded_weights(capsys):
    folder = Path(wp.build({}))
    info = json.loads((folder / "creditlab_recipe.json").read_text())
    assert info["adapter"] == "shipped" and info["merged_modules"] == 210
    assert info["merged_weights_sha256"] == MERGED_SHA256
    assert "adapter_model.safetensors sha256" in capsys.readouterr().out  # verified at load


def test_eval_on_a_file_prints_both_lines(tmp_path, capsys):
    rows = [{"question": "Tom has 3 apples and buys 4 more. How many apples does he have now?",
             "answer": "3 + 4 = 7\n#### 7"},
            {"question": "A box holds 6 pens. How many pens are in 2 boxes?", "answer": "6 * 2 = 12\n#### 12"}]
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["eval", "model=smollm2_135m_word_problems", "task=word_problems", "rollout.max_new_tokens=64",
          "--data", str(data), "--samples", "2", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "greedy accuracy:" in out and "sampled accuracy:" in out
    records = [json.loads(line) for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft -> transformers
def test_a_warm_restart_starts_from_the_shipped_adapter():
    """``init``: a fresh LoRA wrapper takes the shipped adapter's weights, every one of them; an
    adapter of another rank is refused, naming both."""
    import torch
    from creditlab_smollm2 import convert
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    key = wp.checkpoint_dir({}).name
    base = convert.build_smollm2(wp.resolve_args({})["base"])

    def fresh(r):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        return get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules="all-linear"))

    model = fresh(16)
    wp._load_adapter(model, key, 16, 32)
    shipped = load_file(str(wp.SHIPPED / key / "adapter_model.safetensors"))
    params = {name.replace(".default.", "."): p for name, p in model.named_parameters() if "lora_" in name}
    assert len(params) == len(shipped) == 420
    assert all(torch.equal(params[name], tensor) for name, tensor in shipped.items())
    with pytest.raises(ValueError, match="has r 16, alpha 32; this build asks for r 8, alpha 16"):
        wp._load_adapter(fresh(8), key, 8, 16)
