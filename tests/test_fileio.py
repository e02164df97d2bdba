"""colabfast.where._fileio on small real files: retries and backoff, retried reads, tree listing, names of
temporary and state files, atomic writes, the lock, the readahead file and byte units."""

from __future__ import annotations

import errno
import io
import os
import threading
from pathlib import Path

import pytest

from colabfast.where import _fileio
from colabfast.where._fileio import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    MIN_READ,
    NAME_MAX,
    PARTIAL_SUFFIX,
    FileEntry,
    ReadaheadFile,
    backoff,
    fits_name_max,
    human_bytes,
    is_transient,
    locked,
    partial_name,
    partial_path,
    pread_retrying,
    read_json,
    retry,
    scan_tree,
    state_name,
    unchanged,
    write_all,
    write_json_atomic,
)


@pytest.fixture
def waits(monkeypatch) -> list[int]:
    """The retry number of every wait, instead of waiting."""
    seen: list[int] = []
    monkeypatch.setattr(_fileio, "backoff", lambda attempt: seen.append(attempt) or 0.0)
    return seen


def failing(times: int, err: int = errno.EIO, value="done"):
    """A function that raises OSError(err) its first ``times`` calls, then returns ``value``; ``calls``
    counts them."""

    def fn():
        fn.calls += 1
        if fn.calls <= times:
            raise OSError(err, os.strerror(err))
        return value

    fn.calls = 0
    return fn


# --- retries ----------------------------------------------------------------------------------------


def test_transient_errors_are_drives_passing_trouble():
    assert all(is_transient(OSError(e, "x")) for e in (errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT, errno.EAGAIN))
    assert not is_transient(OSError(errno.ENOENT, "x")) and not is_transient(OSError(errno.ENOSPC, "x"))
    assert not is_transient(ValueError("x")) and not is_transient(OSError("no errno"))


def test_retry_retries_transient_errors_then_gives_up_with_the_attempts(waits):
    fn = failing(2)
    assert retry(fn, retries=2) == "done" and fn.calls == 3 and waits == [0, 1]
    waits.clear()
    fn = failing(10)
    with pytest.raises(OSError) as err:
        retry(fn, retries=3)
    assert err.value.errno == errno.EIO and err.value.attempts == 4 and fn.calls == 4 and waits == [0, 1, 2]


def test_retry_raises_other_errors_at_once(waits):
    fn = failing(1, errno.ENOENT)
    with pytest.raises(FileNotFoundError) as err:
        retry(fn, retries=5)
    assert fn.calls == 1 and err.value.attempts == 1 and waits == []

    def boom():
        raise KeyError("not an OSError")

    with pytest.raises(KeyError):
        retry(boom, retries=5)


def test_retry_does_not_retry_an_error_already_retried_below(waits):
    """A read retried per range (pread_retrying) sets ``attempts``: the retry around it must not
    multiply the retries."""
    calls = []

    def fn():
        calls.append(1)
        exc = OSError(errno.EIO, "retried below")
        exc.attempts = 6
        raise exc

    with pytest.raises(OSError) as err:
        retry(fn, retries=5)
    assert len(calls) == 1 and err.value.attempts == 6 and waits == []


def test_backoff_doubles_to_the_cap_with_jitter():
    for attempt in range(12):
        nominal = min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt)
        seen = [backoff(attempt) for _ in range(200)]
        assert all(0.5 * nominal <= s <= 1.5 * nominal for s in seen), attempt
        assert min(seen) < 0.75 * nominal and max(seen) > 1.25 * nominal  # jittered, not in lockstep
    assert BACKOFF_BASE * 2**12 > BACKOFF_CAP  # so the cap was reached above


def test_a_retried_read_never_asks_for_more_than_the_caller_did():
    """A failed read is retried in smaller requests; one already smaller than MIN_READ was retried as
    MIN_READ, past the end of its range, so a big file's range hashed bytes of the next range and
    ``verify="sha256"`` failed a correct copy (test_big_file_ranges_from_drive, about 1 run in 30)."""
    asked = []

    def flaky(n: int, offset: int) -> bytes:
        asked.append(n)
        if len(asked) == 1:
            raise OSError(errno.EIO, "injected")
        return bytes(n)

    n = MIN_READ // 3
    assert len(pread_retrying(flaky, n, 0, retries=2, reopen=None)) == n
    assert asked[1] <= n
    asked.clear()
    assert len(pread_retrying(flaky, 8 * MIN_READ, 0, retries=2, reopen=None)) == 2 * MIN_READ  # a quarter


def test_a_retried_read_shrinks_to_min_read_reopens_and_keeps_its_offset(waits):
    asked, reopened = [], []

    def flaky(n: int, offset: int) -> bytes:
        asked.append((n, offset))
        if len(asked) <= 3:
            raise OSError(errno.ENOTCONN, "client restarted")
        return b"x" * n

    assert pread_retrying(flaky, 64 * MIN_READ, 4096, retries=3, reopen=lambda: reopened.append(1)) == b"x" * MIN_READ
    assert asked == [(64 * MIN_READ, 4096), (16 * MIN_READ, 4096), (4 * MIN_READ, 4096), (MIN_READ, 4096)]
    assert len(reopened) == 3 and waits == [0, 1, 2]


def test_a_read_that_keeps_failing_says_how_often_it_tried(waits):
    def dead(n: int, offset: int) -> bytes:
        raise OSError(errno.EIO, "dead")

    with pytest.raises(OSError) as err:
        pread_retrying(dead, 100, 0, retries=2)
    assert err.value.attempts == 3 and waits == [0, 1]

    def missing(n: int, offset: int) -> bytes:
        raise OSError(errno.EBADF, "bad fd")

    with pytest.raises(OSError) as err:
        pread_retrying(missing, 100, 0, retries=2)
    assert err.value.attempts == 1


# --- listing a tree ---------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "tree"
    (root / "b" / "deep").mkdir(parents=True)
    (root / "a").mkdir()
    (root / "empty").mkdir()
    (root / "top.bin").write_bytes(b"1" * 10)
    (root / "a" / "x.bin").write_bytes(b"2" * 20)
    (root / "b" / "deep" / "y.bin").write_bytes(b"3" * 30)
    (root / "b" / "link.bin").symlink_to(root / "top.bin")  # followed: a file of its own
    (root / "b" / "loop").symlink_to(root / "b")  # a folder reached twice: listed once
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    (root / "a" / f".x.bin{PARTIAL_SUFFIX}").write_bytes(b"half")  # colabfast's own files
    (root / ".colabfast-stage.json").write_text("{}")
    return root


def test_scan_tree_lists_files_and_folders_sorted(tree):
    files, dirs = scan_tree(tree, workers=4)
    st = (tree / "a" / "x.bin").stat()
    assert [(f.rel, f.size) for f in files] == [
        ("a/x.bin", 20), ("b/deep/y.bin", 30), ("b/link.bin", 10), ("top.bin", 10)]
    assert files[0] == FileEntry("a/x.bin", 20, st.st_mtime_ns)
    assert dirs == ["a", "b", "b/deep", "empty"]


def test_scan_tree_records_or_raises_a_folder_it_cannot_list(tree, monkeypatch):
    real = os.scandir

    def scandir(path):
        if Path(path) == tree / "b":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PermissionError):
        scan_tree(tree, workers=2, retries=0)
    unreadable: dict = {}
    files, dirs = scan_tree(tree, workers=2, retries=0, unreadable=unreadable)
    assert list(unreadable) == ["b"] and unreadable["b"].errno == errno.EACCES
    assert [f.rel for f in files] == ["a/x.bin", "top.bin"] and dirs == ["a", "empty"]


# --- names, state and atomic writes -----------------------------------------------------------------


def test_partial_names_stay_within_name_max():
    assert partial_name("x.bin") == f".x.bin{PARTIAL_SUFFIX}"
    assert partial_path(Path("/d/x.bin")) == Path(f"/d/.x.bin{PARTIAL_SUFFIX}")
    longest_plain = "n" * (NAME_MAX - 1 - len(PARTIAL_SUFFIX))  # 236 bytes: "." + name + suffix fits
    assert partial_name(longest_plain) == f".{longest_plain}{PARTIAL_SUFFIX}"
    for long in ("n" * (len(longest_plain) + 1), "é" * 120, "n" * NAME_MAX):
        tmp = partial_name(long)
        assert fits_name_max(tmp) and tmp.startswith(".") and tmp.endswith(PARTIAL_SUFFIX), long
        assert tmp == partial_name(long) and tmp != partial_name(long[:-1] + "m")
    assert fits_name_max("n" * NAME_MAX) and not fits_name_max("n" * (NAME_MAX + 1))
    assert not fits_name_max("é" * 128)  # bytes count, not characters


def test_state_names_are_unique_per_absolute_path(tmp_path, monkeypatch):
    a, b = tmp_path / "one" / "data", tmp_path / "two" / "data"
    assert state_name(a) != state_name(b) and state_name(a).startswith("data-")
    assert state_name(a) == state_name(a)
    monkeypatch.chdir(tmp_path)
    assert state_name(Path("one/data")) == state_name(a)
    long = tmp_path / ("x" * 200)
    assert state_name(long).startswith("x" * 64 + "-") and fits_name_max(state_name(long))


def test_unchanged_is_rsyncs_quick_check(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    st = f.stat()
    assert unchanged(st, 5, st.st_mtime_ns)
    assert not unchanged(st, 4, st.st_mtime_ns) and not unchanged(st, 5, st.st_mtime_ns + 1)
    assert not unchanged(None, 5, st.st_mtime_ns)
    d = tmp_path.stat()
    assert not unchanged(d, d.st_size, d.st_mtime_ns)  # a folder is never a copy of a file


def test_write_all_finishes_short_writes_and_refuses_a_write_of_nothing(tmp_path, monkeypatch):
    real_write, real_pwrite = os.write, os.pwrite
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: real_pwrite(fd, bytes(data[:5]), offset))
    data = bytes(range(100))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        write_all(fd, data)
        write_all(fd, memoryview(data[:40]), offset=200)
        assert os.pread(fd, 300, 0) == data + bytes(100) + data[:40]
        monkeypatch.setattr(os, "write", lambda fd, data: 0)
        with pytest.raises(OSError) as err:
            write_all(fd, b"more")
        assert err.value.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_json_is_written_atomically_and_read_forgivingly(tmp_path):
    path = tmp_path / "state.json"
    assert read_json(path) is None
    write_json_atomic(path, {"a": [1, 2], "b": "x"})
    assert read_json(path) == {"a": [1, 2], "b": "x"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary file left
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # fails half-way through writing
    assert read_json(path) == {"a": [1, 2], "b": "x"}  # the old file is whole
    path.write_text('{"a": ')
    assert read_json(path) is None
    path.write_text("[1, 2]")
    assert read_json(path) is None  # not an object


def test_locked_excludes_a_second_holder_until_the_first_leaves(tmp_path):
    lock = tmp_path / "locks" / "x.lock"
    order = []

    def second():
        with locked(lock, "staging x"):
            order.append("second")

    with locked(lock, "staging x"):
        assert lock.parent.is_dir()
        t = threading.Thread(target=second)
        t.start()
        t.join(0.3)
        order.append("first")
    t.join(10)
    assert order == ["first", "second"]


# --- the readahead file -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 4096 * 3 + 17])
def test_readahead_file_reads_and_seeks_as_a_plain_file(tmp_path, size):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    with ReadaheadFile(tmp_path / "f", block_size=1000, depth=3) as f:
        assert f.size == size and f.seekable() and f.readable()
        assert b"".join(iter(lambda: f.read(333), b"")) == data
        assert f.seek(size // 2) == size // 2 and f.read(50) == data[size // 2: size // 2 + 50]
        assert f.tell() == min(size, size // 2 + 50)
        assert f.seek(-10, io.SEEK_END) == max(0, size - 10) and f.read(10) == data[max(0, size - 10):]
        f.seek(0)
        assert f.read(10**6) == data[:1000]  # one block at most per read
    assert f.closed


def test_readahead_file_retries_a_failed_block_and_names_a_file_that_shrank(tmp_path, monkeypatch):
    monkeypatch.setattr(_fileio, "BACKOFF_BASE", 0.001)
    data = os.urandom(10_000)
    (tmp_path / "f").write_bytes(data)
    real, failed = os.pread, []

    def flaky(fd, n, offset):
        if offset == 4000 and not failed:
            failed.append(offset)
            raise OSError(errno.EIO, "injected")
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", flaky)
    with ReadaheadFile(tmp_path / "f", block_size=1000, depth=4) as f:
        assert f.read(10**6) == data[:1000] and io.BufferedReader(f).read() == data[1000:]
    assert failed == [4000]
    with ReadaheadFile(tmp_path / "f", block_size=4000, depth=2) as f:
        os.truncate(tmp_path / "f", 6000)
        with pytest.raises(OSError) as err:
            io.BufferedReader(f).read()
    assert err.value.errno == errno.EIO and f"{tmp_path / 'f'} ended at byte 6000, expected 10000" in str(err.value)


def test_human_bytes_is_decimal():
    assert human_bytes(0) == "0 B" and human_bytes(999) == "999 B"
    assert human_bytes(1000) == "1.0 kB" and human_bytes(812_000) == "812.0 kB"
    assert human_bytes(14.2e6) == "14.2 MB" and human_bytes(7.1e9) == "7.1 GB" and human_bytes(2e12) == "2.0 TB"
    assert human_bytes(1 << 30) == "1.1 GB"  # a GiB is not a GB
    assert human_bytes(-2.5e6) == "-2.5 MB"


def test_an_isolated_child_imports_the_colabfast_this_process_imported(monkeypatch):
    """python_child's child (python -I) finds colabfast where this process found it, also run from the
    folder that holds it (a checkout used in place), which is left out of the child's path as the
    current folder."""
    import subprocess
    from pathlib import Path

    import colabfast

    monkeypatch.chdir(Path(colabfast.__file__).parents[1])
    out = subprocess.run(_fileio.python_child("import colabfast; print(colabfast.__file__)"), capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == colabfast.__file__
