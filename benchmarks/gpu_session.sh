#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool's `run`), as the brief asks: the CUDA tests, then
# `colabfast bench gpu` (ResNet-50 against the data-on-GPU ceiling, feed="thread" and feed="process",
# DALI where installed), then the feed probe with its CPU per thread, each pinned to 2 CPUs as Colab.
#
#     OUT=/some/folder BUDGET_S=480 bash benchmarks/gpu_session.sh
#
# Writes machine.txt, cuda-tests.log, bench.md/.json/.png, bench.log and probe.log under $OUT.
# Wheels the GPU image lacks (simplejpeg, defusedxml, pytest-timeout for Python 3.12) travel in .whl/.
set -uo pipefail
out=${OUT:-gpu-session-out}
mkdir -p "$out"
start=$(date +%s)
budget=${BUDGET_S:-480}
left() { echo $((budget - ($(date +%s) - start))); }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  nvidia-smi
  lscpu | grep -E '^CPU\(s\)|Model name'
  python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
  echo "commit ${COMMIT:-unknown}"
} >"$out/machine.txt" 2>&1
# every file that holds a `cuda`-marked test; the others import packages the GPU image lacks
timeout 200 python3 -m pytest -p no:cacheprovider -q -m cuda tests/test_feedprocess.py tests/test_bench.py \
  tests/test_diagnosis.py tests/test_env.py tests/test_gpudecode.py tests/test_loading.py tests/test_prefetch.py \
  2>&1 | tee "$out/cuda-tests.log" | tail -4
timeout $(($(left) > 120 ? $(left) : 120)) taskset -c 0,1 python3 -m colabfast.cli bench gpu --size 0.5 --repeats 3 \
  --out "$out" 2>&1 | tee "$out/bench.log" | tail -32
t=$(($(left) - 5))
if [ "$t" -gt 60 ]; then
  timeout "$t" taskset -c 0,1 python3 benchmarks/gpu_feed_probe.py --images 1500 --repeats 3 \
    --only "defaults: the feeder reads, pinned;feed in a subprocess (feed='process')" 2>&1 | tee "$out/probe.log" | tail -8
fi
