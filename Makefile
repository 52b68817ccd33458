# Every target creates .venv when it is missing (torch's CPU build first, so pip keeps it).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.creditlab-installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: setup  ## the embedded default: arith task + tiny local model, GRPO, on the CPU
	$(BIN)/creditlab train $(ARGS)

test: setup  ## the whole suite (unit, contract, config, integration)
	$(BIN)/python -m pytest -q $(ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(ARGS)

bench: setup
	$(BIN)/python -m pip install -q -e ".[bench]"
	$(BIN)/python benchmarks/grpo_step_vs_trl.py $(ARGS)

clean:
	rm -rf runs outputs multirun wandb lightning_logs
