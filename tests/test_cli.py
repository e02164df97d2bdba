"""The colabfast command line, run as users run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import assert_same_tree

from colabfast.testing.data import make_files, make_imagefolder

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colabfast.cli", *args], capture_output=True, text=True)


def test_help_lists_every_command():
    out = run("--help")
    assert out.returncode == 0
    for command in ("stage", "pack", "info", "drivesim", "demo", "bench", "doctor"):
        assert command in out.stdout
    assert "--verify" in run("stage", "--help").stdout
    assert "--image-size" in run("pack", "--help").stdout


def test_version_is_the_package_version():
    import colabfast

    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"colabfast {colabfast.__version__}"
    from importlib.metadata import version

    assert version("colabfast") == colabfast.__version__  # pyproject reads it from the package


def test_version_checks_the_install_and_names_a_broken_torchvision(tmp_path, monkeypatch):
    """Issue 41 item 3: --version printed fine while `import torchvision` was broken."""
    from colabfast.where import env

    broken = tmp_path / "site" / "torchvision"
    broken.mkdir(parents=True)  # what a torchvision built for another torch does at import
    (broken / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    out = subprocess.run([sys.executable, "-m", "colabfast.cli", "--version"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(broken.parent), str(ROOT)])})
    assert out.returncode == 1 and out.stdout.startswith("colabfast ")
    assert "import torchvision fails (RuntimeError: operator torchvision::nms does not exist)" in out.stderr

    import importlib.metadata

    versions = {"torch": "2.14.1+cpu", "torchvision": "0.26.0"}
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions.get(name) or real(name))
    problems = env.install_problems()
    assert problems == [problems[0]] and "torch 2.14.1+cpu and torchvision 0.26.0 were not built together" in \
        problems[0] and "torchvision 0.26 goes with torch 2.11" in problems[0] and "torchvision==0.29.*" in problems[0]
    versions["torchvision"] = "0.29.1"
    assert env.install_problems() == []


def test_stage_pack_info(tmp_path):
    src = make_files(tmp_path / "src", 12, 1000, per_folder=4)
    out = run("stage", str(src), str(tmp_path / "dst"), "-q")
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / "dst")
    assert_same_tree(src, tmp_path / "dst")
    inet = make_imagefolder(tmp_path / "inet", classes=2, per_class=3, size=(40, 30))
    out = run("pack", str(inet), str(tmp_path / "m.h5"), "--image-size", "24", "--store", "raw", "-q")
    assert out.returncode == 0, out.stderr
    out = run("info", str(tmp_path / "m.h5"))
    assert out.returncode == 0
    assert "layout imagefolder, store raw, resized to 24" in out.stdout and "2 classes" in out.stdout


def test_errors_are_one_line_not_a_traceback(tmp_path):
    out = run("stage", str(tmp_path / "missing"))
    assert out.returncode == 1 and "does not exist" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "x.h5").write_text("not hdf5")
    out = run("info", str(tmp_path / "x.h5"))
    assert out.returncode == 1 and "x.h5" in out.stderr


def test_doctor_describes_the_machine_and_the_data(tmp_path):
    make_files(tmp_path / "data", 3, 1000)
    out = run("doctor", str(tmp_path / "data"))
    assert out.returncode == 0
    assert out.stdout.startswith("platform") and "CPUs" in out.stdout and "advice:" in out.stdout
    assert f"{tmp_path / 'data'}: 3.0 kB in 3 files" in out.stdout
    assert "your data is on local disk" in out.stdout
    assert "usage: colabfast doctor [-h] [data]" in run("doctor", "--help").stdout


def test_cli_speaks_its_own_options_and_warns_in_one_line(tmp_path):
    """Issue 13: the pack error told command-line users to "pass on_error='skip'", and --skip-errors
    printed a raw UserWarning with a source line."""
    bad = tmp_path / "imgs" / "a"
    bad.mkdir(parents=True)
    (bad / "1.jpg").write_text("not an image")
    out = run("pack", str(tmp_path / "imgs"), str(tmp_path / "m.h5"), "-q")
    assert out.returncode == 1 and "--skip-errors" in out.stderr and "on_error" not in out.stderr
    out = run("pack", str(tmp_path / "imgs"), str(tmp_path / "m2.h5"), "-q", "--skip-errors")
    assert out.returncode == 0
    warning = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith("colabfast: warning: pack: skipped 1 unreadable file")
    (tmp_path / "empty").mkdir()
    out = run("stage", str(tmp_path / "empty"), str(tmp_path / "dst"), "-q")
    assert out.returncode == 0 and out.stderr.startswith("colabfast: warning:") and "UserWarning" not in out.stderr
    assert "--overwrite" in run("stage", "--help").stdout and "--allow-links" in run("stage", "--help").stdout


def test_stage_overwrite_flag_replaces_a_foreign_folder(tmp_path):
    src = make_files(tmp_path / "src", 3, 100)
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "notes.txt").write_text("mine")
    out = run("stage", str(src), str(tmp_path / "dst"), "-q")
    assert out.returncode == 1 and "--overwrite" in out.stderr and (tmp_path / "dst" / "notes.txt").exists()
    assert run("stage", str(src), str(tmp_path / "dst"), "-q", "--overwrite").returncode == 0
    assert_same_tree(src, tmp_path / "dst")


def test_every_public_exception_class_is_a_colabfast_error_in_colabfast_errors():
    """Every exception class a module of the package holds under a public name is defined in
    colabfast.errors (issue 38: one errors.py), derives from colabfast.Error (``except
    colabfast.Error`` catches it, the CLI prints it as one line) and is reachable as
    ``colabfast.errors.<name>``; those a user catches also as ``colabfast.<name>``."""
    import importlib
    import inspect
    import pkgutil

    import colabfast as cf
    from colabfast import errors

    found = {}
    for module in pkgutil.walk_packages(cf.__path__, "colabfast."):
        mod = importlib.import_module(module.name)
        for value in vars(mod).values():
            if inspect.isclass(value) and issubclass(value, BaseException) \
                    and value.__module__.startswith("colabfast.") and not value.__name__.startswith("_"):
                assert value.__module__ == "colabfast.errors", f"{value.__module__}.{value.__name__}"
                found[value.__name__] = value
    assert len(found) >= 25 and {"ImageSizeError", "SplitRefused", "NothingToOpen"} <= set(found)
    assert set(found) == set(errors.__all__)
    for name, cls in found.items():
        assert issubclass(cls, cf.Error), name
        assert getattr(cf.errors, name) is cls, name
    # the ones users catch are at the top too (issue 54, item 6); the refusals of bad arguments stay in cf.errors
    caught = {"Error", "DriveError", "FetchError", "StageError", "NotEnoughSpace", "PackError", "SplitRefused",
              "ArchiveReadError", "MirrorError", "LayoutError", "LoaderStateError", "CacheLimitError"}
    assert {name for name in cf.__all__ if name in found} == caught
    assert all(getattr(cf, name) is found[name] for name in caught)


def test_every_colabfast_error_is_a_colabfast_error_and_one_line(monkeypatch, capsys):
    """Issue 16, item 7: one base, the old stdlib bases kept, and the CLI prints any of them as a line."""
    import colabfast as cf
    from colabfast import cli
    from colabfast.staging import pipeline as staging

    for name, base in [("DriveError", RuntimeError), ("FetchError", RuntimeError), ("StageError", OSError),
                       ("PackError", ValueError), ("MirrorError", ValueError), ("ArchiveReadError", ValueError),
                       ("UnsafeArchiveError", ValueError)]:
        cls = getattr(cf.errors, name)
        assert issubclass(cls, cf.Error) and issubclass(cls, base), name
    assert callable(cf.info)

    def fail(*args, **kwargs):
        raise cf.DriveError("Drive is not mounted")

    monkeypatch.setattr(staging, "stage", fail)
    assert cli.main(["stage", "x"]) == 1
    err = capsys.readouterr().err
    assert err == "colabfast stage: Drive is not mounted\n"


def test_pack_passes_retries_labels_and_split(monkeypatch, capsys, tmp_path):
    """`colabfast pack` exposes pack()'s retries= (as stage does), labels= and split= (ImageNet's archives)."""
    from colabfast import cli, packing

    calls = []
    monkeypatch.setattr(packing, "pack", lambda *args, **kwargs: calls.append((args, kwargs)))
    val, devkit, dst = tmp_path / "ILSVRC2012_img_val.tar", tmp_path / "devkit.tar.gz", tmp_path / "val.h5"
    assert cli.main(["pack", str(val), str(dst), "--labels", str(devkit), "--retries", "9", "-q"]) == 0
    (args, kwargs), = calls
    assert args == (str(val), str(dst))
    assert kwargs["labels"] == str(devkit) and kwargs["split"] is None and kwargs["retries"] == 9
    assert kwargs["layout"] == "auto" and kwargs["progress"] is False
    calls.clear()
    assert cli.main(["pack", "kaggle.zip", str(dst), "--split", "val", "--layout", "kaggle-val"]) == 0
    (_, kwargs), = calls
    assert kwargs["split"] == "val" and kwargs["labels"] is None and kwargs["retries"] == 5
    assert kwargs["layout"] == "kaggle-val"
    assert capsys.readouterr().out.splitlines() == [str(dst), str(dst)]


def test_pack_command_covers_every_pack_keyword_with_its_default(monkeypatch):
    """`colabfast pack` with no options calls pack() with each keyword at pack()'s own default, and with
    every keyword but fields= (the columns of a map-style dataset, which a command line cannot give):
    a keyword added to pack() fails here until the command has its flag."""
    import inspect

    from colabfast import cli, packing

    params = inspect.signature(packing.pack).parameters
    calls = []
    monkeypatch.setattr(packing, "pack", lambda *args, **kwargs: calls.append(kwargs))
    assert cli.main(["pack", "src", "dst.h5"]) == 0
    (kwargs,) = calls
    keywords = {name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(kwargs) == keywords - {"fields"}
    assert kwargs == {k: params[k].default for k in kwargs}


def test_pack_layouts_are_the_librarys():
    """The command's --layout choices are the registry's (looked up when asked: no numpy import for --help)."""
    from colabfast import cli
    from colabfast.layouts import REGISTRY

    assert set(cli._PACK_LAYOUTS) == {"auto", *REGISTRY}


def test_pack_speaks_labels_and_split_as_options(tmp_path, capsys):
    from colabfast import cli

    inet = make_imagefolder(tmp_path / "inet", classes=2, per_class=1, size=(16, 12))
    assert cli.main(["pack", str(inet), str(tmp_path / "m.h5"), "--split", "val", "-q"]) == 1
    err = capsys.readouterr().err
    assert "--labels and --split are for packing from an archive" in err and "labels=" not in err


def test_pack_imagenet_validation_tar_from_the_command_line(tmp_path):
    from colabfast.testing.imagenet_archives import make_imagenet_archives

    paths = make_imagenet_archives(tmp_path, classes=2, train_per_class=1, val_per_class=2, size=(40, 30))
    out = run("pack", str(paths["val"]), str(tmp_path / "bare.h5"), "-q")
    assert out.returncode == 1 and "pass --labels DEVKIT" in out.stderr
    out = run("pack", str(paths["val"]), str(tmp_path / "val.h5"), "--labels", str(paths["devkit"]), "-q")
    assert out.returncode == 0, out.stderr
    info = run("info", str(tmp_path / "val.h5")).stdout
    assert "4 images" in info and f"labels from {paths['devkit']}" in info


def test_stage_rerun_says_it_is_up_to_date(tmp_path):
    """Issue 23 item 18: a re-run printed only the path; it says that nothing needed copying (on
    stderr: stdout stays the path, for scripts)."""
    src = make_files(tmp_path / "src", 3, 100)
    first = run("stage", str(src), str(tmp_path / "dst"))
    assert first.returncode == 0 and "up to date" not in first.stderr
    again = run("stage", str(src), str(tmp_path / "dst"))
    assert again.returncode == 0 and again.stdout.strip() == str(tmp_path / "dst")
    assert f"{tmp_path / 'dst'} is up to date, nothing copied" in again.stderr


def test_pack_refuses_to_replace_a_file_unless_overwrite(tmp_path):
    """Issue 23 item 6: `colabfast pack src notes.txt` replaced the user's file."""
    inet = make_imagefolder(tmp_path / "inet", classes=2, per_class=1, size=(16, 12))
    (tmp_path / "notes.txt").write_text("mine")
    out = run("pack", str(inet), str(tmp_path / "notes.txt"), "-q")
    assert out.returncode == 1 and "--overwrite" in out.stderr and "overwrite=True" not in out.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert run("pack", str(inet), str(tmp_path / "notes.txt"), "-q", "--overwrite").returncode == 0
    assert "--overwrite" in run("pack", "--help").stdout


def test_pack_messages_speak_of_the_command_not_the_python_function(tmp_path):
    """Issue 23 items 16 and 18: a missing src "is not a folder", a file src did not mention archives,
    messages named pack(); --seed and info's argument had no help."""
    out = run("pack", str(tmp_path / "missing"), str(tmp_path / "m.h5"), "-q")
    assert out.returncode == 1 and "missing does not exist" in out.stderr and "pack()" not in out.stderr
    (tmp_path / "notes.txt").write_text("not a dataset")
    out = run("pack", str(tmp_path / "notes.txt"), str(tmp_path / "m.h5"), "-q")
    assert out.returncode == 1 and "is a file, not a dataset folder or an archive" in out.stderr
    assert ".tar.gz" in out.stderr and "pack()" not in out.stderr
    bad = tmp_path / "imgs" / "a"
    bad.mkdir(parents=True)
    (bad / "1.jpg").write_text("not an image")
    out = run("pack", str(tmp_path / "imgs"), str(tmp_path / "m.h5"), "-q")
    assert out.returncode == 1 and "run the same command again" in out.stderr and "pack()" not in out.stderr
    import h5py

    h5py.File(tmp_path / "other.h5", "w").close()
    out = run("info", str(tmp_path / "other.h5"))
    assert out.returncode == 1 and "Make one with colabfast pack" in out.stderr
    assert "the seed of --shuffle" in run("pack", "--help").stdout
    assert "the mirror file" in run("info", "--help").stdout


def test_ctrl_c_during_pack_is_one_line_and_the_next_run_says_it_resumes(tmp_path):
    """Issue 23 item 14: Ctrl-C printed 38 lines of worker tracebacks before the one line, and the
    resumed run's bar started at 0 without saying it resumed."""
    import os
    import re
    import signal
    from pathlib import Path

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=600, size=(64, 48))
    dst, work = tmp_path / "m.h5", tmp_path / ".m.h5.colabfast-pack"
    # The pack says on a pipe when its third part is saved and then waits for the Ctrl-C, however loaded
    # the machine; SIGABRT makes faulthandler print every thread's stack: what a hang below shows.
    ready, told = os.pipe()
    code = ("import sys, colabfast.packing.common as c\nc.CHUNK = 20\n"
            "from colabfast.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    pausing = ("import faulthandler, os, signal, sys, colabfast.packing.folders as f\n"
               "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # as in a terminal, though CI ran us with &
               "faulthandler.enable(all_threads=True)\nsave, told = f.save_part, int(sys.argv.pop(1))\n"
               "def saved(path, result, parts=[]):\n    save(path, result)\n    parts.append(path)\n"
               "    if len(parts) == 3:\n        os.write(told, b'3')\n        signal.pause()\n"
               "f.save_part = saved\n") + code
    cwd = Path(__file__).parents[1]
    child = subprocess.Popen([sys.executable, "-c", pausing, str(told), "pack", str(src), str(dst), "--workers", "2",
                              "-q"], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             pass_fds=[told], start_new_session=True)  # a terminal's Ctrl-C reaches its group
    os.close(told)
    with os.fdopen(ready, "rb") as pipe:
        assert pipe.read(1) == b"3", child.communicate()[1]  # empty: the pack ended before its third part
    os.killpg(child.pid, signal.SIGINT)
    try:
        _, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # the code before the fix could hang here: say where it hangs
        os.kill(child.pid, signal.SIGABRT)
        _, err = child.communicate()
        os.killpg(child.pid, signal.SIGKILL)
        raise AssertionError(f"pack did not end within 120 s of Ctrl-C; its threads:\n{err[-6000:]}") from None
    assert child.returncode == 130, err
    assert err.splitlines() == ["interrupted; run the same command again to resume"]
    parts = len(list(work.glob("*.npz")))
    assert parts == 3
    again = subprocess.run([sys.executable, "-c", code, "pack", str(src), str(dst), "--workers", "2"], cwd=cwd,
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    done = int(re.search(r"pack: resuming: (\d+) of 1200 images were packed by an earlier run", again.stdout)[1])
    assert done == parts * 20
    first = re.search(r"(\d+)/1200 ", again.stderr)  # the bar's first state
    assert first is not None and int(first[1]) == done


def test_diagnose_measures_the_loader_and_a_training_step(tmp_path):
    """Issue 39 item 6: `colabfast diagnose` (there was none)."""
    from colabfast.packing import pack

    mirror = pack(make_imagefolder(tmp_path / "src", classes=2, per_class=12, size=(48, 40)), tmp_path / "m.h5",
                  progress=False)
    alone = run("diagnose", str(mirror), "--batch-size", "4", "--crop", "16", "--steps", "2", "-q")
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.startswith("colabfast.diagnose: loader only: ")
    assert f"data: {mirror} (local disk)" in alone.stdout
    trained = run("diagnose", str(mirror), "--batch-size", "4", "--crop", "16", "--steps", "2", "--model", "resnet18")
    assert trained.returncode == 0, trained.stderr
    assert "colabfast.DataLoader(H5ImageFolder, 24 samples, batch_size=4)" in trained.stdout
    assert "% of each step waits for data" in trained.stdout and "in step() (2 steps measured)" in trained.stdout
    wrong = run("diagnose", str(mirror), "--model", "resnet18", "--batch-size", "30", "--steps", "1", "-q")
    assert wrong.returncode == 1 and "colabfast diagnose:" in wrong.stderr


def test_open_takes_labels_where_it_takes_layout(tmp_path):
    """Issue 39 B1: `colabfast open --layout csv` asked for labels= and open had no --labels."""
    from PIL import Image

    root = tmp_path / "comp"  # two tables, neither named after the folder of images: no guess to make
    (root / "images").mkdir(parents=True)
    for name in ("a1", "a2"):
        Image.new("RGB", (6, 5), (1, 2, 3)).save(root / "images" / f"{name}.jpg")
    (root / "labels.csv").write_text("id,label\na1,ant\na2,bee\n")
    (root / "other.csv").write_text("id\na1\n")
    out = run("open", str(root), "--layout", "csv", "-q")
    assert out.returncode == 1 and "pass --labels TABLE" in out.stderr and "labels=" not in out.stderr
    out = run("open", str(root), "--layout", "csv", "--labels", str(root / "labels.csv"), "-q")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(".h5") and Path(out.stdout.strip()).is_file()
    for command in ("open", "pack"):
        assert "--labels FILE" in run(command, "--help").stdout


def test_split_help_says_what_split_means_for_every_layout():
    """Issue 39 B2: open's --split named only KITTI and Kaggle's ImageNet zip."""
    for command in ("open", "pack"):
        text = " ".join(run(command, "--help").stdout.split())
        split = text[text.index("--split SPLIT"):]
        for words in ("voc-*: the image set", "yolo: the export's split folder", "coco: none", "Kaggle's ImageNet "
                      "zip: train (default) or val", "ImageNet's tars, imagefolder, segmentation, csv, files: none"):
            assert words in split, (command, words)
    assert "kitti: the mirror's split to open, training (default) or testing" in " ".join(
        run("open", "--help").stdout.split())


def test_open_a_single_file_says_what_to_pass_in_one_line(tmp_path):
    """Issue 39 B3: a CSV or an image given alone got ~700 characters listing every layout."""
    from PIL import Image

    (tmp_path / "t.csv").write_text("file,label\na.jpg,0\n")
    Image.new("RGB", (4, 4)).save(tmp_path / "a.jpg")
    (tmp_path / "ann.json").write_text("{}")
    expected = {"t.csv": f"t.csv is a CSV table: pass its folder ({tmp_path}) with --layout csv --labels "
                         f"'{tmp_path / 't.csv'}'",
                "a.jpg": f"a.jpg is one image: pass the folder that holds the images ({tmp_path})",
                "ann.json": "ann.json is a JSON file: for COCO annotations, pass the folder of their images with "
                            f"--layout coco --labels '{tmp_path / 'ann.json'}'"}
    for name, message in expected.items():
        out = run("open", str(tmp_path / name), "-q")
        assert out.returncode == 1 and out.stderr.strip().endswith(message), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "accepts" not in out.stderr


def test_open_an_empty_folder_fails_at_once(tmp_path):
    """Issue 39 B4: an empty folder took 13 s to be refused: the readers (torchvision, h5py) were
    imported and the folder listed for a layout before anything said it was empty."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / ".DS_Store").write_text("")
    code = ("import sys\nfrom colabfast.opening import NothingToOpen, open_dataset\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n        open_dataset(path)\n    except NothingToOpen as exc:\n        print(exc)\n"
            "print(sorted(m for m in ('torch', 'torchvision', 'h5py', 'numpy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "empty"), str(tmp_path / "hidden")],
                         capture_output=True, text=True)
    assert out.stdout.splitlines() == [
        f"nothing to open: {tmp_path / 'empty'} is an empty folder (it holds nothing): pass the folder that holds "
        "the dataset",
        f"nothing to open: {tmp_path / 'hidden'} is an empty folder (it holds only hidden entries (.DS_Store)): pass "
        "the folder that holds the dataset",
        "[]"], out.stderr
    out = run("open", str(tmp_path / "empty"), "-q")
    assert out.returncode == 1 and "is an empty folder" in out.stderr and not (tmp_path / "colabfast-mirrors").exists()


def test_open_streams_with_to_stream(tmp_path):
    """Issue 52, item 7: `colabfast open --to` had no stream."""
    make_imagefolder(tmp_path / "pets", classes=2, per_class=2, size=(16, 12))
    out = run("open", str(tmp_path / "pets"), "--to", "stream", "--mirrors", str(tmp_path / "m"))
    assert out.returncode == 0, out.stderr
    assert "stream" in out.stdout and out.stdout.strip().splitlines()[-1].startswith(str(tmp_path / "m"))
