#!/usr/bin/env bash
# Make the pieces in which NVIDIA DALI travels to a lent GPU machine (benchmarks/gpu_session.sh): DALI's
# wheel for CUDA 13 and what it needs for Python 3.12, unpacked, stripped of other Pythons' modules and
# DALI's C++ headers, packed as one tar.xz (about 167 MB for DALI 2.4.0) and split into pieces of
# 56 MiB in .dali/ (ignored: add /.dali/ to .git/info/exclude), one piece for each warm call to carry.
# Prints the SHA-256 that gpu_session.sh's DALI_SHA256 checks the reassembled file against.
#
#     bash benchmarks/dali_pieces.sh [VERSION]    # e.g. 2.4.0; default: the newest
set -euo pipefail
version=${1:+==$1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  -d "$work/wheels" "nvidia-dali-cuda130$version" astunparse gast optree nvtx makefun "libcst~=1.8" \
  "nvidia-nvimgcodec-cu13>=0.9,<0.10" "nvidia-libnvcomp-cu13>=5,<6" "nvidia-nvjpeg>=13,<14"
mkdir "$work/site"
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done
# the GPU image's Python is 3.12: other versions' extension modules and DALI's headers stay behind;
# no nvidia/__init__.py, so that nvidia stays a namespace package beside torch's CUDA wheels
find "$work/site" -name '*.cpython-3*.so' ! -name '*cpython-312-*' -delete
rm -rf "$work/site/nvidia/dali/include" "$work/site/nvidia/__init__.py"
tar -C "$work/site" -cf - . | xz -9e -T0 >"$work/dali.tar.xz"
mkdir -p .dali
rm -f .dali/piece.*
split -b 56M "$work/dali.tar.xz" .dali/piece.
ls -l .dali
echo "DALI_SHA256=$(sha256sum "$work/dali.tar.xz" | cut -d' ' -f1)"
