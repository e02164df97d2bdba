"""colabfast.loading.prefetch: Normalize, BatchConverter (CPU) and CUDAPrefetcher (CUDA-marked tests)."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import torch
from conftest import assert_flat_over_epochs_with_breaks
from torchvision.transforms import v2

from colabfast.images import transforms
from colabfast.images.decode import EncodedImages, decode_cpu
from colabfast.loading.prefetch import BatchConverter, CUDAPrefetcher, Feeder, Feeding, ImageList, Normalize, normalize
from colabfast.testing.data import encode, photo

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

cuda = pytest.mark.cuda


def need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def hwc_batch(b=4, h=12, w=10, seed=0) -> torch.Tensor:
    """uint8 [B, 3, H, W] as a channels-last view of HWC memory, like the uint8 collate makes."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, h, w, 3), dtype=torch.uint8, generator=g).permute(0, 3, 1, 2)


def reference(x: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """torchvision's way: ToDtype(scale=True) then Normalize, in float32, contiguous."""
    y = v2.Normalize(MEAN, STD)(v2.ToDtype(torch.float32, scale=True)(x.contiguous()))
    return y.to(dtype)


def jpeg_files(n=5, size=(48, 32), seed=0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.frombuffer(bytearray(encode(photo(*size, rng))), dtype=torch.uint8) for _ in range(n)]


# --- Normalize ----------------------------------------------------------------------------------------


def test_uint8_to_float32_matches_torchvision_todtype_and_normalize():
    x = hwc_batch()
    out = normalize(x, mean=MEAN, std=STD)
    assert out.dtype == torch.float32 and out.is_contiguous()
    torch.testing.assert_close(out, reference(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype, atol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2), (torch.float64, 1e-6)])
def test_half_and_double_are_rounded_once_from_the_exact_value(dtype, atol):
    x = hwc_batch()
    out = normalize(x, dtype=dtype, mean=MEAN, std=STD)
    assert out.dtype == dtype
    exact = (x.double() / 255 - torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)) / torch.tensor(
        STD, dtype=torch.float64
    ).view(3, 1, 1)
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=atol)


def test_dtype_only_scales_uint8_like_todtype_and_keeps_floats():
    x = hwc_batch()
    torch.testing.assert_close(normalize(x, dtype=torch.float32), x.float() / 255, rtol=0, atol=1e-7)
    floats = torch.rand(2, 3, 5, 5)
    out = normalize(floats, mean=(0.5,), std=(0.25,))  # floats are not divided by 255
    torch.testing.assert_close(out, (floats - 0.5) / 0.25, rtol=0, atol=1e-6)


def test_memory_formats():
    x = hwc_batch()
    assert normalize(x, mean=MEAN, std=STD).is_contiguous()
    cl = normalize(x, mean=MEAN, std=STD, memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last) and not cl.is_contiguous()
    torch.testing.assert_close(cl, reference(x))
    assert normalize(x).is_contiguous() and torch.equal(normalize(x), x)  # uint8, made contiguous
    one = normalize(x[0], mean=MEAN, std=STD, memory_format=torch.channels_last)
    assert one.shape == (3, 12, 10) and one.permute(1, 2, 0).is_contiguous()
    torch.testing.assert_close(one, reference(x)[0])


def test_nothing_to_do_returns_the_same_tensor():
    x = hwc_batch().contiguous()
    assert normalize(x) is x
    cl = hwc_batch()
    assert Normalize(memory_format=torch.channels_last)(cl) is cl


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="floating dtype"):
        Normalize(torch.uint8, MEAN, STD)
    with pytest.raises(ValueError, match="zero"):
        Normalize(std=(0.2, 0.0, 0.2))
    with pytest.raises(ValueError, match="3 values but the images have 1 channels"):
        normalize(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), mean=MEAN, std=STD)
    with pytest.raises(ValueError, match="images"):
        normalize(torch.zeros(2, 5), mean=MEAN)


def test_constants_are_made_once_per_device_and_dtype():
    n = Normalize(torch.float16, MEAN, STD)
    n(hwc_batch())
    n(hwc_batch(seed=1))
    assert len(n._constants) == 1


# --- BatchConverter on the CPU -------------------------------------------------------------------------


def test_converter_normalises_images_and_keeps_targets():
    x = hwc_batch()
    targets = [[{"type": "Car", "bbox": [1.0, 2.0, 3.0, 4.0]}], []]
    labels = torch.arange(4)
    out = BatchConverter("cpu", Normalize(None, MEAN, STD))([x, labels, targets, "name"])
    assert isinstance(out, list) and len(out) == 4
    torch.testing.assert_close(out[0], reference(x))
    assert out[1] is labels and out[2] is targets and out[3] == "name"


def test_converter_moves_dict_batches_but_will_not_guess_their_images():
    batch = {"image": hwc_batch(), "label": torch.arange(4)}
    assert BatchConverter("cpu", Normalize())(batch) is batch
    with pytest.raises(ValueError, match="keys \\['image', 'label'\\]"):
        BatchConverter("cpu", Normalize(None, MEAN, STD))(batch)


def test_converter_ragged_images_become_a_list_or_a_batch_after_a_transform():
    ragged = ImageList([hwc_batch(1, 12, 10)[0], hwc_batch(1, 9, 11, seed=1)[0]])
    out = BatchConverter("cpu", Normalize(None, MEAN, STD))((ragged, torch.tensor([0, 1])))
    assert type(out[0]) is list and [tuple(i.shape) for i in out[0]] == [(3, 12, 10), (3, 9, 11)]
    torch.testing.assert_close(out[0][1], reference(ragged[1].unsqueeze(0))[0])
    resized = BatchConverter("cpu", Normalize(), transform=v2.Resize((8, 8), antialias=True))(ragged)
    assert resized.shape == (2, 3, 8, 8) and resized.dtype == torch.uint8


def test_converter_decodes_encoded_images_on_the_cpu():
    files = jpeg_files(3)
    out = BatchConverter("cpu", Normalize(torch.float32))(EncodedImages.pack(files, [7, 8, 9]))
    assert out.shape == (3, 3, 32, 48)
    torch.testing.assert_close(out[2], decode_cpu(files[2]).float() / 255)


def test_prefetcher_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        CUDAPrefetcher([], "cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        CUDAPrefetcher([], "cpu")


# --- Feeder: the thread and queue, on the CPU --------------------------------------------------------


class Batches:
    """A re-iterable loader whose iterators count how many are open and fail at ``fail_at``."""

    def __init__(self, n=20, fail_at=None):
        self.n, self.fail_at, self.open = n, fail_at, 0

    def __iter__(self):
        self.open += 1
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise ValueError(f"cannot decode the image at dataset index {i}")
                yield torch.full((2, 3, 4, 4), i, dtype=torch.uint8)
        finally:
            self.open -= 1


def convert_cpu(batch):
    return normalize(batch, dtype=torch.float32)


def test_feeder_hands_out_every_batch_in_order():
    got = list(Feeder(iter(Batches(30)), convert_cpu, depth=2))
    assert [int(x[0, 0, 0, 0] * 255 + 0.5) for x in got] == list(range(30))
    assert all(x.dtype == torch.float32 for x in got)


def test_feeder_raises_at_the_batch_where_the_error_happened():
    seen = []
    with pytest.raises(ValueError, match="dataset index 7"):
        for x in Feeder(iter(Batches(30, fail_at=7)), convert_cpu, depth=3):
            seen.append(int(x[0, 0, 0, 0] * 255 + 0.5))
    assert seen == list(range(7))


def test_fifty_epochs_with_early_breaks_leave_no_thread_running():
    """One owner of the feeders (Feeding, as DataLoader and CUDAPrefetcher hold it): each epoch's source
    iterator is made only once the previous epoch's feeder has stopped and closed its own."""
    loader = Batches(40)
    feeding = Feeding(convert_cpu, None, 2)
    threads = threading.active_count()

    def batches():
        assert loader.open == 0  # no feeder is still reading the previous epoch's iterator
        return iter(loader)

    for epoch in range(50):
        feeder = feeding.start(batches)
        for i, _ in enumerate(feeder):
            if i == epoch % 5:
                break
        if epoch % 2:  # dropped, as after `break`; on even epochs it lives on until start() closes it
            del feeder
    last = feeding.start(batches)
    next(last)
    feeding.stop()
    assert last._done and not last._thread.is_alive()  # stopped though still referenced
    feeding.stop()  # idempotent
    feeder = last = None
    gc.collect()
    assert threading.active_count() == threads
    assert loader.open == 0  # each epoch's source iterator was closed, in the thread that ran it


def test_a_dropped_feeder_stops_its_thread_and_queue_is_bounded():
    pulled = []

    def source():
        for i in range(1000):
            pulled.append(i)
            yield torch.zeros(1)

    feeder = Feeder(source(), lambda b: b, depth=3)
    next(feeder)
    time.sleep(0.3)  # the thread runs ahead until the queue is full, then waits
    assert len(pulled) <= 1 + 3 + 1 + 1  # handed out, queued, one converted waiting to be queued
    thread = feeder._thread
    del feeder
    gc.collect()
    assert not thread.is_alive()


def test_an_interrupt_while_waiting_for_a_batch_stops_the_feeder():
    """A notebook's interrupt (KeyboardInterrupt in the training thread) while the loop waits for a
    batch: the traceback a notebook keeps would hold the feeder, so it must stop its thread itself."""
    import signal

    assert threading.current_thread() is threading.main_thread()  # where SIGINT raises KeyboardInterrupt
    # Python ignores SIGINT for good when started ignoring it (a job started with & by a script: CI)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    made, waiting = threading.Event(), threading.Event()

    def nothing_until_the_feeder_stops():  # no batch ever arrives first, however loaded the machine
        made.wait()
        feeder._stop.wait()
        yield from ()

    feeder = Feeder(nothing_until_the_feeder_stops(), convert_cpu, depth=2)
    made.set()
    get = feeder._queue.get
    feeder._queue.get = lambda *args, **kwargs: (waiting.set(), get(*args, **kwargs))[1]
    main = threading.main_thread().ident
    # SIGINT once the training thread waits for its batch, as a notebook's interrupt button sends it
    ctrl_c = threading.Thread(target=lambda: waiting.wait() and signal.pthread_kill(main, signal.SIGINT))
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(feeder)
    finally:
        signal.signal(signal.SIGINT, before)
    ctrl_c.join()
    assert not feeder._thread.is_alive()  # stopped and joined, though the exception still holds it
    with pytest.raises(StopIteration):
        next(feeder)


def test_feeder_rejects_a_zero_depth():
    with pytest.raises(ValueError, match="depth"):
        Feeder(iter([]), convert_cpu, depth=0)


def test_converter_runs_a_batched_transform_once_per_batch():
    calls = []

    class Spy(transforms.CenterCrop):
        def __call__(self, images):
            calls.append(len(images))
            return super().__call__(images)

    ragged = ImageList([hwc_batch(1, 12, 10)[0], hwc_batch(1, 9, 11, seed=1)[0], hwc_batch(1, 8, 8, seed=2)[0]])
    out = BatchConverter("cpu", Normalize(), transform=Spy(6))(ragged)
    assert calls == [3] and out.shape == (3, 3, 6, 6) and out.dtype == torch.uint8
    for got, image in zip(out, ragged):
        assert torch.equal(got, v2.CenterCrop(6)(image))


# --- CUDA --------------------------------------------------------------------------------------------


def host_batches(n=6, b=8, h=64, w=48, pin=True):
    batches = []
    for i in range(n):
        x = hwc_batch(b, h, w, seed=i)
        y = torch.arange(b) + i * b
        batches.append([x.pin_memory() if pin else x, y.pin_memory() if pin else y, [{"i": i}] * b])
    return batches


@cuda
def test_prefetcher_output_equals_the_cpu_path():
    need_cuda()
    batches = host_batches()
    for dtype, fmt in [(torch.float32, None), (torch.float16, torch.channels_last), (torch.bfloat16, None)]:
        pf = CUDAPrefetcher(batches, "cuda", mean=MEAN, std=STD, dtype=dtype, memory_format=fmt)
        cpu = BatchConverter("cpu", Normalize(dtype, MEAN, STD, fmt))
        got = list(pf)
        assert len(got) == len(batches) == len(pf)
        for (x, y, t), host in zip(got, batches):
            want = cpu(host)
            assert x.is_cuda and y.is_cuda and x.dtype == dtype
            assert x.is_contiguous(memory_format=fmt or torch.contiguous_format)
            torch.testing.assert_close(x.cpu().float(), want[0].float(), rtol=0, atol=1e-2)
            assert torch.equal(y.cpu(), host[1]) and t == host[2]


@cuda
def test_one_stream_for_all_epochs_and_no_memory_growth():
    need_cuda()
    pf = CUDAPrefetcher(host_batches(4, b=16, h=128, w=128), "cuda", mean=MEAN, std=STD)
    stream = pf.stream
    reserved = []
    for _epoch in range(20):
        for x, _, _ in pf:
            (x * 2).sum()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
        assert pf.stream is stream
    assert reserved[-1] == reserved[2], reserved  # timm#2781 grew this with a stream per epoch


@cuda
def test_handed_out_memory_is_not_reused_while_the_consumer_reads_it():
    need_cuda()
    # A slow consumer: each batch is read after a GPU sleep, after Python dropped it. Without
    # wait_stream the read could see a half-copied batch; without record_stream the side stream
    # could reuse the memory for a later batch before the read runs.
    batches = host_batches(12, b=32, h=64, w=64)
    sums = []
    for x, _, _ in CUDAPrefetcher(batches, "cuda", dtype=torch.float32):
        torch.cuda._sleep(2_000_000)
        sums.append(x.sum())
        del x
    got = torch.stack(sums).cpu()
    want = torch.stack([b[0].float().div(255).sum() for b in batches])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-2)


@cuda
def test_copies_overlap_with_compute():
    need_cuda()
    batches = host_batches(10, b=128, h=224, w=224)  # 19 MB of uint8 per batch: ~1.5 ms over PCIe 3

    def run(loader):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for batch in loader:
            x = batch[0]
            torch.cuda._sleep(5_000_000)  # "the model", a few ms of GPU time
            x.mean()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def serial():
        convert = BatchConverter("cuda", Normalize(torch.float32, MEAN, STD))
        for b in batches:
            yield convert(b)
            torch.cuda.synchronize()  # no overlap: copy, then compute, then the next copy

    run(CUDAPrefetcher(batches, "cuda", mean=MEAN, std=STD))  # warm up allocator and kernels
    overlapped = run(CUDAPrefetcher(batches, "cuda", mean=MEAN, std=STD))
    assert overlapped < run(serial())


@cuda
def test_feeder_on_cuda_fifty_epochs_with_breaks_keep_threads_and_memory_flat():
    need_cuda()
    pf = CUDAPrefetcher(host_batches(6, b=16, h=64, w=64), "cuda", mean=MEAN, std=STD, depth=2)
    assert_flat_over_epochs_with_breaks(pf, period=4)


@cuda
def test_batched_transforms_on_cuda_equal_the_cpu_result():
    need_cuda()
    rng = np.random.default_rng(3)
    images = [decode_cpu(torch.frombuffer(bytearray(encode(photo(int(rng.integers(200, 320)),
                                                                  int(rng.integers(150, 240)), rng))),
                                          dtype=torch.uint8)) for _ in range(6)]
    make = lambda: transforms.Compose([  # noqa: E731
        transforms.RandomResizedCrop(64, generator=torch.Generator().manual_seed(5)),
        transforms.RandomHorizontalFlip(generator=torch.Generator().manual_seed(6))])
    cpu = make()(images)
    gpu = make()([i.cuda() for i in images])
    assert gpu.is_cuda and gpu.shape == cpu.shape == (6, 3, 64, 64)
    assert (gpu.cpu().int() - cpu.int()).abs().max() <= 1  # same crops, float rounding apart
