"""The package's shape (issue 38, item 2): a folder per stage of the data path, read in order, with no import
cycle, no import from a stage into a later one, and nothing in the library importing the tools beside it."""

from __future__ import annotations

import ast
from pathlib import Path

import colabfast

PACKAGE = Path(colabfast.__file__).parent
# The data path, in order: a folder may import its own modules and those of folders before it, never after.
STAGES = ("where", "drivesim", "drive", "staging", "images", "mirror", "layouts", "packing", "datasets", "loading",
          "diagnosis", "opening")
# Beside the data path: built on the library, never imported by it.
TOOLS = ("colabfast.tools", "colabfast.testing")
# The top level: the stage folders, the tools, and the few modules every stage shares or that front all of them.
TOP_LEVEL = {*STAGES, "tools", "testing", "__init__.py", "errors.py", "cli.py"}
MAX_LINES = 680  # "about 650": no module of the library longer


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The colabfast modules ``path`` imports anywhere in its body (at import time or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from colabfast import env` names a module; `from colabfast.where.env import gpu` a name in one.
            # `from colabfast.drive import exposing` imports a module; `from colabfast.env import gpu` a name
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= names if names <= known else names | {node.module}
    return {name for name in found if name in known}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files) - {"colabfast"}
    return {name: imports(path, known) - {name} for name, path in files.items() if name in known}


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle in ``edges`` as a path that returns to its start, or [] when there is none."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def folder(module: str) -> str:
    """The top-level entry a module lives in: a stage folder, a tool folder, or itself (``colabfast.errors``)."""
    return module.split(".")[1] if module.count(".") else ""


def product(module: str) -> bool:
    return not module.startswith(TOOLS) and module != "colabfast.cli"


def test_the_graph_is_read_from_the_source():
    edges = graph()
    assert "colabfast.where.env" in edges["colabfast.diagnosis.doctor"]
    assert "colabfast.staging.destination" in edges["colabfast.diagnosis.doctor"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
    assert folder("colabfast.where.env") == "where" and folder("colabfast.errors") == "errors"


def test_the_top_level_reads_as_the_data_path():
    found = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert found == TOP_LEVEL
    for stage in STAGES:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage


def test_the_package_has_no_import_cycles():
    """Issue 24, item 1: the whole package, its tools and colabfast.testing included, with no edge
    excused."""
    assert cycle(graph()) == []


def test_no_stage_imports_a_later_stage():
    """0 arrows back up: each import goes to the same folder, an earlier stage, or a shared top-level module."""
    rank = {stage: i for i, stage in enumerate(STAGES)}
    up = []
    for module, targets in graph().items():
        if not product(module) or folder(module) not in rank:
            continue
        for target in targets:
            if folder(target) in rank and rank[folder(target)] > rank[folder(module)]:
                up.append(f"{module} -> {target}")
    assert up == []


def test_the_shared_top_level_modules_import_no_stage():
    edges = graph()
    assert edges["colabfast.errors"] == set()


def test_nothing_in_the_library_imports_the_tools():
    wrong = [f"{m} -> {t}" for m, targets in graph().items() if product(m) for t in targets if t.startswith(TOOLS)]
    assert wrong == []


def test_no_library_module_is_longer_than_about_650_lines():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if product(name) and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES:
            long[name] = n
    assert long == {}


def test_env_probes_only():
    """env sits at the bottom: everything asks it about the machine, and it asks no other module but
    the mount table's and the stand-in's (to recognise it where drive_kind, drive_mounts and storage
    look)."""
    assert graph()["colabfast.where.env"] <= {"colabfast.where._fileio", "colabfast.where.mounttable",
                                              "colabfast.where.standin", "colabfast.where"}


def test_the_mount_table_has_one_reader_below_env_the_standin_and_the_simulator():
    """Issue 24, item 1: colabfast.where.mounttable reads /proc/self/mountinfo for env, the stand-in and the
    Drive simulator, which all import it, and it imports none of them."""
    edges = graph()
    assert edges["colabfast.where.mounttable"] <= {"colabfast.where._fileio", "colabfast.where"}
    for user in ("colabfast.where.env", "colabfast.where.standin", "colabfast.drivesim.fs"):
        assert "colabfast.where.mounttable" in edges[user], user


def test_the_standin_has_one_owner_below_env():
    """Issue 16, item 4: colabfast.where.standin owns the local stand-in for Drive and sits below env (which
    asks it), so it imports no module that probes the machine but the mount table's; showing it at a
    mountpoint (colabfast.drive.exposing) starts the simulator, and the Drive module calls that for the
    local case."""
    edges = graph()
    assert edges["colabfast.where.standin"] <= {"colabfast.where._fileio", "colabfast.errors",
                                                "colabfast.where.mounttable", "colabfast.where"}
    assert edges["colabfast.drivesim.fs"] <= {"colabfast.where._fileio", "colabfast.errors",
                                              "colabfast.where.mounttable", "colabfast.where"}
    assert "colabfast.drivesim.simulator" in edges["colabfast.drive.exposing"]
    assert "colabfast.drive.exposing" in edges["colabfast.drive.mounting"]


def test_the_library_never_imports_the_simulator_or_the_test_tools_at_import_time():
    """Issue 16, item 4: importing the library (and using its Drive module) loads neither
    colabfast.testing nor the Drive simulator; the simulator is imported only when a stand-in mount
    asks for it."""
    import subprocess
    import sys

    code = ("import sys, colabfast as cf, colabfast.drive, colabfast.where.env, colabfast.where.standin, "
            "colabfast.staging, colabfast.loading\ncf.env.drive_kind('/'); cf.env.standin_mountpoints()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('colabfast.testing', 'colabfast.tools', "
            "'colabfast.drivesim'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_old_entry_points_still_work():
    """Public names stay as they were: ``python -m colabfast.drivesim``, ``cf.env``, ``cf.doctor``,
    ``from colabfast import transforms`` (the notebooks'), ``colabfast.drive.mount``."""
    import subprocess
    import sys

    from colabfast import transforms
    from colabfast.images import transforms as moved

    assert transforms is moved and colabfast.env.__name__ == "colabfast.where.env"
    assert colabfast.doctor.__name__ == "colabfast.diagnosis.doctor"
    assert colabfast.drive.mount is colabfast.mount and colabfast.mirror.info is colabfast.info
    out = subprocess.run([sys.executable, "-m", "colabfast.drivesim", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "MOUNTPOINT" in out.stdout


def test_every_public_module_lists_its_public_names():
    """Public names are few and listed: each library module (not the private ``_x`` ones, not the tools)
    has an ``__all__`` whose every name it defines."""
    import importlib

    testing = sorted((PACKAGE / "testing").glob("*.py"))  # documented for users' own tests
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if path.name.startswith("_") and path.name != "__init__.py" or (name.startswith(TOOLS)
                                                                         and path not in testing):
            continue
        if path.name == "__init__.py" and "__all__" not in path.read_text(encoding="utf-8"):
            continue  # a stage folder that only says what it holds
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def test_one_repository_url_everywhere_a_user_installs_from():
    """Issue 13: the notebooks' install cell, their Colab badges, the README and pyproject's URL name
    the same repository, so a move or rename cannot leave one of them installing something else."""
    import json
    import re

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = PACKAGE.parent
    home = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Homepage"]
    slug = home.removeprefix("https://github.com/")
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert f'pip install -q "git+{home}"' in readme and f"git clone {home}" in readme
    for name in ("quickstart", "kitti", "imagenet", "detection", "huggingface", "yolo"):
        cells = json.loads((root / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]
        text = ["".join(c["source"]) for c in cells]
        assert f'pip install -q "git+{home}"' in text[1], name  # the first code cell
        badge = f"colab.research.google.com/github/{slug}/blob/main/notebooks/{name}.ipynb"
        assert badge in text[0] and badge in readme, name
        assert set(re.findall(r"github\.com/([\w.-]+/[\w.-]+)", "\n".join(text))) == {slug}, name


def test_the_library_imports_only_what_it_declares():
    """The wheel check in .ci/run reuses the test environment's packages, so an import of something
    pyproject.toml does not list (scipy, say, which the test extra brings) would pass CI and fail a
    user. Every third-party import in the library (not the bench and testing tools, whose extras
    differ) is a declared dependency, or guarded: inside ``try: ... except ImportError`` with a clear
    message, or under ``TYPE_CHECKING``."""
    import importlib.metadata
    import re
    import sys

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {re.split(r"[<>=!~;\[ ]", d)[0].lower().replace("_", "-") for d in project["dependencies"]}
    dists = importlib.metadata.packages_distributions()
    transitive = {"requests": "gdown"}  # used only for gdown's exception types; gdown requires it

    def guarded(chain: list[ast.AST]) -> bool:
        for parent in chain:
            if isinstance(parent, ast.If) and "TYPE_CHECKING" in ast.unparse(parent.test):
                return True
            if isinstance(parent, ast.Try) and any(
                h.type is not None and re.search(r"\b(ImportError|ModuleNotFoundError)\b", ast.unparse(h.type))
                for h in parent.handlers
            ):
                return True
        return False

    def walk(node: ast.AST, chain: list[ast.AST]):
        for child in ast.iter_child_nodes(node):
            yield child, chain
            yield from walk(child, chain + [child])

    unguarded = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if module_name(path).startswith(("colabfast.tools.bench", "colabfast.testing")):
            continue
        for node, chain in walk(ast.parse(path.read_text(encoding="utf-8")), []):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "colabfast":
                    continue
                dist = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if dist & declared or transitive.get(top) in declared or guarded(chain):
                    continue
                unguarded.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {name}")
    assert not unguarded, unguarded


def test_the_drop_in_named_for_each_layout_is_open_datasets():
    """h5dataset names the class a mirror needs without importing opening (an import circle): the
    names must agree with opening.DROP_INS."""
    from colabfast.datasets import h5dataset
    from colabfast.opening import DROP_INS

    for layout, (cls, _) in DROP_INS.items():
        assert h5dataset._reads(layout) == cls.__name__, layout
