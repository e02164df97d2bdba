#!/usr/bin/env bash
# Calls on a lent GPU machine (the device tool's `run`), as the brief asks: the CUDA tests, then
# `colabfast bench gpu` (ResNet-50 against the data-on-GPU ceiling, feed="thread" and feed="process",
# DALI where installed), then the feed probe with its CPU per thread, each pinned to 2 CPUs as Colab.
#
#     OUT=/some/folder BUDGET_S=480 STEPS="tests bench probe" bash benchmarks/gpu_session.sh
#
# STEPS picks what runs (default, or empty: all three; "none": nothing but the DALI pieces). Writes
# machine.txt, cuda-tests.log, bench.md/.json/.png, bench.log and probe.log under $OUT. Wheels the GPU image lacks (simplejpeg, defusedxml, pytest-timeout
# for Python 3.12) travel in .whl/.
#
# NVIDIA DALI is larger than one call may carry (64 MiB): its wheel and what it needs, unpacked, stripped
# of other Pythons' modules and packed as one tar.xz (167 MB for DALI 2.4.0), travel in pieces of 56 MiB
# in .dali/, one piece a call while the machine stays warm (it keeps /tmp between calls): every call appends the
# pieces it carries to /tmp/dali.tar.xz, and a call whose STEPS holds "dali" unpacks the whole into
# /tmp/dali-site (checked against DALI_SHA256) and puts it on PYTHONPATH for the steps after it.
# benchmarks/dali_pieces.sh makes the pieces and prints DALI_SHA256. On 2026-11-28 (three calls):
#     STEPS=tests ...  (carry .whl .dali/piece.aa), STEPS=none ...  (.dali/piece.ab),
#     STEPS="dali bench probe" DALI_SHA256=... ...  (.dali/piece.ac)
set -uo pipefail
out=${OUT:-gpu-session-out}
mkdir -p "$out"
start=$(date +%s)
budget=${BUDGET_S:-480}
steps=" ${STEPS:-tests bench probe} "
left() { echo $((budget - ($(date +%s) - start))); }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .dali ]; then
  for piece in .dali/*; do
    cat "$piece" >>/tmp/dali.tar.xz && rm "$piece" && echo "appended $piece: $(stat -c %s /tmp/dali.tar.xz) bytes so far"
  done
fi
if [[ $steps == *" dali "* ]]; then
  echo "${DALI_SHA256:-none}  /tmp/dali.tar.xz" | sha256sum -c - \
    && python3 -c 'import tarfile; tarfile.open("/tmp/dali.tar.xz").extractall("/tmp/dali-site", filter="data")' \
    && export PYTHONPATH=$PYTHONPATH:/tmp/dali-site \
      LD_LIBRARY_PATH=/tmp/dali-site/nvidia/cu13/lib:/tmp/dali-site/nvidia/libnvcomp/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    && python3 -c 'import nvidia.dali as d; print("DALI", d.__version__)' 2>&1 | tail -3
fi
{
  nvidia-smi
  lscpu | grep -E '^CPU\(s\)|Model name'
  python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
  echo "commit ${COMMIT:-unknown}"
} >"$out/machine.txt" 2>&1
if [[ $steps == *" tests "* ]]; then
  # every file that holds a `cuda`-marked test; the others import packages the GPU image lacks
  timeout 200 python3 -m pytest -p no:cacheprovider -q -m cuda tests/test_feedprocess.py tests/test_bench.py \
    tests/test_diagnosis.py tests/test_env.py tests/test_gpudecode.py tests/test_loading.py tests/test_prefetch.py tests/test_resume.py \
    2>&1 | tee "$out/cuda-tests.log" | tail -4
fi
if [[ $steps == *" bench "* ]]; then
  timeout $(($(left) > 120 ? $(left) : 120)) taskset -c 0,1 python3 -m colabfast.cli bench gpu --size 0.5 --repeats 3 \
    --out "$out" 2>&1 | tee "$out/bench.log" | tail -32
fi
t=$(($(left) - 5))
if [[ $steps == *" probe "* ]] && [ "$t" -gt 60 ]; then
  timeout "$t" taskset -c 0,1 python3 benchmarks/gpu_feed_probe.py --images 1500 --repeats 3 \
    --only "defaults: the feeder reads, pinned;feed in a subprocess (feed='process')" 2>&1 | tee "$out/probe.log" | tail -8
fi
