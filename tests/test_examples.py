"""The ``Examples:`` of the public entry points' docstrings (issue 53, item 4) run as doctests, each in a
fresh world as a new user's notebook would be: Drive's stand-in mounted at ``/content/drive`` holding
``flowers/`` (an ImageFolder tree of daisy and rose) and a YOLO export ``pets-yolo/``, and the working
folder holding ``flowers.h5``, the mirror of ``flowers/``."""

from __future__ import annotations

import doctest

import pytest

import colabfast as cf
from colabfast.drive import mounting
from colabfast.testing.data import make_imagefolder
from colabfast.testing.layouts import make_yolo

ENTRY_POINTS = ("stage", "pack", "DataLoader", "H5Dataset", "open_dataset", "ultralytics_data")


@pytest.fixture
def world(standin, tmp_path, monkeypatch):
    flowers = make_imagefolder(standin / "MyDrive" / "flowers", classes=["daisy", "rose"], per_class=4, size=(64, 48))
    make_yolo(standin / "MyDrive" / "pets-yolo", 4, size=(64, 48), classes=("cat", "dog"))
    monkeypatch.chdir(tmp_path)
    cf.pack(flowers, tmp_path / "flowers.h5", workers=0, progress=False)
    yield
    mounting.flush_and_unmount()


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_the_examples_run_as_shown(world, name, capsys):
    tests = [t for t in doctest.DocTestFinder().find(getattr(cf, name), f"colabfast.{name}", globs={}) if t.examples]
    assert tests, f"colabfast.{name}'s docstring has no Examples"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, capsys.readouterr().out
