"""CPU and wall milliseconds per batch of 128 JPEGs (about 500x375) decoded onto the GPU: torchvision's
nvJPEG call (what colabfast's feed uses) against nvImageCodec's backends, the hardware JPEG decoder
(A100, H100, H200, L4) among them; mean level difference to torchvision's pixels.

    taskset -c 0,1 python benchmarks/gpu_decoders_probe.py [--rounds 20]

Needs a CUDA GPU; nvImageCodec (pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg) for its rows.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from torchvision.io import ImageReadMode, decode_jpeg

from colabfast.testing import data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="colabfast-decoders-"))
    tree = data.make_imagefolder(tmp / "tree", classes=2, per_class=64, size=(500, 375), vary=0.15)
    files = sorted(f for f in tree.rglob("*") if f.suffix.lower() in (".jpg", ".jpeg"))[:128]
    raw = [f.read_bytes() for f in files]
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in raw]
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    torch.cuda.init()
    print(f"{torch.cuda.get_device_name()}, {len(raw)} JPEGs, CPUs {sorted(os.sched_getaffinity(0))}")
    reference = [x.float() for x in decode_jpeg(tensors, mode=ImageReadMode.RGB, device="cuda")]

    def timed(name, decode):
        try:
            out = decode()
        except Exception as exc:
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:150]} | | |", flush=True)
            return
        diff = sum(float((o.float() - r).abs().mean()) for o, r in zip(out, reference)) / len(out)
        for _ in range(3):
            decode()
        torch.cuda.synchronize()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(args.rounds):
            decode()
        torch.cuda.synchronize()
        wall, cpu = (time.perf_counter() - t0) / args.rounds, (time.process_time() - c0) / args.rounds
        print(f"| {name} | {cpu * 1e3:.1f} | {wall * 1e3:.1f} | {diff:.2f} |", flush=True)

    print("| decoder | CPU ms per batch | wall ms per batch | mean level difference to torchvision |")
    print("|---|---|---|---|")
    timed("torchvision.io.decode_jpeg(list, device='cuda')",
          lambda: decode_jpeg(tensors, mode=ImageReadMode.RGB, device="cuda"))
    try:
        from nvidia import nvimgcodec
    except ImportError as exc:
        print(f"nvImageCodec not importable: {exc}")
        return
    kinds = {"default backends": None, "hardware decoder only": "HW_GPU_ONLY", "GPU only (CUDA)": "GPU_ONLY",
             "hybrid CPU+GPU": "HYBRID_CPU_GPU"}
    for name, kind in kinds.items():
        try:
            backends = None if kind is None else [nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind))]
            decoder = nvimgcodec.Decoder(device_id=0, backends=backends) if backends else \
                nvimgcodec.Decoder(device_id=0)
        except Exception as exc:
            print(f"| nvImageCodec, {name} | failed to build: {type(exc).__name__}: {str(exc)[:150]} | | |")
            continue

        def decode(decoder=decoder):
            images = decoder.decode(raw)
            return [torch.as_tensor(i, device="cuda").permute(2, 0, 1) for i in images]

        timed(f"nvImageCodec {nvimgcodec.__version__}, {name}", decode)


if __name__ == "__main__":
    main()
