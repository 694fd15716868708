#!/usr/bin/env bash
# The GPU half of the tests, on a machine with CUDA (the lent H200 reaches no package
# registry: wheels carried in .whl/ are installed into .site/ first, see BENCHMARKS.md).
# Writes its logs under $OUT (default /tmp/minicomp-gpu) and prints one line per part.
#   bash scripts/gpu_suite.sh            # `pytest -m gpu`, the zoo in bf16, then property tests and samples on CUDA
#   bash scripts/gpu_suite.sh FILE...    # `pytest -m gpu` over these test files only, nothing else (a device
#                                        # call is 10 minutes at most: split the suite over two calls)
# MINICOMP_GPU_JOBS=N spreads the tests over N pytest-xdist workers (the device image has xdist;
# its host has 16 cores, and most of a GPU test's time is Triton's compiler on the host).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/minicomp-gpu}
mkdir -p "$OUT"
if [ -d .whl ]; then
    # transformers 5.25 wants huggingface_hub 2.x (in .whl/hf/); 5.24 wanted < 2: where .whl/hf1/
    # holds hub 1.x and its httpx, those replace hub 2.x
    W=$(ls .whl/*.whl .whl/hf/*.whl 2>/dev/null)
    H=$(ls .whl/hf1/huggingface_hub-1*.whl .whl/hf1/httpx-*.whl .whl/hf1/httpcore-*.whl .whl/hf1/certifi-*.whl 2>/dev/null)
    [ -n "$H" ] && W=$(echo "$W" | grep -v huggingface_hub-2)
    python3 -m pip install -q --no-index --no-deps --target .site $W $H \
        > "$OUT/pip.log" 2>&1 || echo "pip: see $OUT/pip.log"
fi
# the tests' subprocesses (a loaded cache, an emitted module) import minicomp from this checkout
export PYTHONPATH=$PWD/.site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
JOBS=()
[ -n "${MINICOMP_GPU_JOBS:-}" ] && JOBS=(-n "$MINICOMP_GPU_JOBS")
if [ $# -gt 0 ]; then
    python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=15 "${JOBS[@]}" "$@" > "$OUT/gpu-tests.log" 2>&1
    echo "pytest -m gpu $*: rc=$? $(tail -1 "$OUT/gpu-tests.log")"
    exit 0
fi
python3 -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=15 "${JOBS[@]}" --ignore=tests/test_zoo_lowp.py \
    > "$OUT/gpu-tests.log" 2>&1
echo "pytest -m gpu: rc=$? $(tail -1 "$OUT/gpu-tests.log")"
# the zoo in bf16 against fp32 eager, on its own so its table lands in $OUT; -rs shows a skip
# (no transformers in .site: carry its wheels in .whl/hf/, see BENCHMARKS.md)
MINICOMP_ZOO_LOWP_REPORT="$OUT/zoo-bf16.md" python3 -m pytest -q -p no:cacheprovider -m gpu -rfEs \
    tests/test_zoo_lowp.py > "$OUT/zoo-bf16.log" 2>&1
echo "zoo in bf16 vs fp32 eager (table in $OUT/zoo-bf16.md): rc=$? $(tail -1 "$OUT/zoo-bf16.log")"
MINICOMP_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -rfE tests/test_properties.py tests/test_samples.py \
    > "$OUT/cuda-props.log" 2>&1
echo "property tests and samples on cuda: rc=$? $(tail -1 "$OUT/cuda-props.log")"
