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

.PHONY: setup demo test test-fast bench clean

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

bench: setup
	$(call INSTALL,"$(TORCH)" -e ".[bench]")
	$(BIN)/python benchmarks/grpo_step_vs_trl.py $(ARGS)

clean:
	rm -rf runs outputs multirun wandb lightning_logs
