#!/usr/bin/env bash
# The checks a lent GPU machine runs, in one call (docs/gpu.md, "A lent machine in one call"):
# the GPU suite (fast tests, then the 3-step training runs) and decoding against the device's
# bandwidth (benchmarks/decode_cuda.py). Each stage has its own time limit, so a slow one leaves
# the others their time. Logs and a JSON of the decoding rows go to $OUT.
#
# Needs, carried with the call (the machine reaches no registry): .whl/*.whl (hydra-core,
# omegaconf, antlr4-python3-runtime, transformers 5.24) and .whl/site/creditlab-*.dist-info (the
# entry points and extras of a wheel built here: `uv build --wheel`, its dist-info without
# RECORD). creditlab itself runs from this checkout (PYTHONPATH), so conf/ is found beside it.
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >"$OUT/install.log" 2>&1 || echo "wheel install failed (install.log)"
export PYTHONPATH="$PWD/framework:$PWD/plugins:$PWD/.whl/site:/tmp/site:$PWD"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    python3 - <<'EOF'
import importlib.metadata as m, torch, transformers, lightning
import creditlab.accel as a
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(),
      "transformers", transformers.__version__, "lightning", lightning.__version__)
print("creditlab", m.version("creditlab"), "advantage entry points",
      len(m.entry_points(group="creditlab.advantage")), "fused range", a.tested_transformers())
EOF
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
stage() {  # stage NAME SECONDS CMD...: run with a limit, log to $OUT/NAME.log, print its tail
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: rc $? in $((SECONDS - t0)) s"
    tail -n "${TAIL:-8}" "$OUT/$name.log"
}
# FAST_K / SLOW_K: a pytest -k selection (a rerun of what failed); DECODE_ARGS: decode_cuda.py's
stage fast "${FAST_S:-110}" python3 -m pytest tests/gpu -v -rs -m "not slow" --timeout 100 ${FAST_K:+-k "$FAST_K"}
stage slow "${SLOW_S:-220}" python3 -m pytest tests/gpu -v -rs -m slow --timeout 200 --durations=0 \
    ${SLOW_K:+-k "$SLOW_K"}
# shellcheck disable=SC2086
TAIL=25 stage decode "${DECODE_S:-150}" python3 benchmarks/decode_cuda.py \
    ${DECODE_ARGS:---batch 16,64,256 --new-tokens 128 --rounds 1} --json "$OUT/decode.json"
