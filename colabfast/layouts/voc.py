"""The ``"voc-detection"`` and ``"voc-segmentation"`` layouts: a Pascal VOC tree as
``torchvision.datasets.VOCDetection`` and ``VOCSegmentation`` read it (``torchvision/datasets/voc.py``:
``DATASET_YEAR_DICT``'s folders, ``_VOCBase.__init__``'s image sets, ``parse_voc_xml`` copied below).
"""

from __future__ import annotations

import collections
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Optional, Union
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree

from colabfast.layouts._untrusted import (
    MAX_ANNOTATION_BYTES,
    MAX_DEPTH,
    MAX_XML_BYTES,
    Problems,
    parallel,
    read_limited,
    safe_rel,
    stat_files,
)
from colabfast.layouts.base import ImageFile, Layout, LayoutError, LayoutFileNotFoundError, LayoutNotFoundError
from colabfast.layouts.registry import register
from colabfast.layouts.tree import Tree, tree_of
from colabfast.where._fileio import FileEntry, PathLike, read_regular, retry

__all__ = ["VOCDetection", "VOCSegmentation", "parse_voc_xml"]

YEAR_DIR = re.compile(r"VOC\d{4}")
TRAINVAL_2011 = "TrainVal/VOCdevkit/VOC2011"  # torchvision's base_dir for 2011: its archive's tree


class _VOCBase(Layout):
    """A Pascal VOC tree's image set as a map-style dataset, in torchvision's order.

    Args:
        root: the folder holding ``VOCdevkit/`` (for 2011 also ``TrainVal/VOCdevkit/VOC2011``),
            ``VOCdevkit`` itself, or one ``VOC20xx`` folder.
        split: the image set, ``ImageSets/<Main or Segmentation>/<split>.txt`` (torchvision's ``image_set``).
        year: which ``VOC<year>`` folder where ``root`` holds several; None: the only one.
        on_error: ``"raise"`` a :class:`LayoutError` at the first problem, or ``"skip"``: leave the
            sample out and list it in ``skipped``.
        retries: retries of each file operation for Drive's transient errors.

    An id must be a plain file name (no ``/``, not hidden) whose files exist inside ``root``.

    Raises:
        LayoutNotFoundError: no VOC tree, or none of that year (a ``RuntimeError`` too, as torchvision's).
        LayoutFileNotFoundError: no such image set file (a ``FileNotFoundError`` too).
        LayoutError: several years and no ``year``, a split that is not a file name, a set file over
            ``MAX_ANNOTATION_BYTES``, or (``on_error="raise"``) a bad id, a missing file or a bad
            target; the message names the file and the line.
    """

    _SPLITS_DIR: ClassVar[str]
    _TARGET_DIR: ClassVar[str]
    _TARGET_EXT: ClassVar[str]

    def __init__(self, root: PathLike, split: str = "train", year: Union[str, int, None] = None, *,
                 on_error: str = "raise", retries: int = 5):
        self.root = Path(root)
        self.retries = retries
        problems = Problems(on_error)
        voc = find_voc(self.root, year)
        base = voc.relative_to(self.root).as_posix()
        prefix = f"{base}/" if base != "." else ""
        set_rel = f"{prefix}ImageSets/{self._SPLITS_DIR}/{split}.txt"
        if safe_rel(split) != split or "/" in split:
            raise LayoutError(self.root, f"split {split!r} is not an image set name", fix="Pass e.g. split='train'")
        if not (self.root / set_rel).is_file():
            names = sorted(p.stem for p in (self.root / set_rel).parent.glob("*.txt") if "_" not in p.stem)
            raise LayoutFileNotFoundError(self.root / set_rel, "is missing", fix=f"Pass split= one of {names}")
        ids = read_ids(self.root / set_rel, retries, problems)

        images = {i: f"{prefix}JPEGImages/{i}.jpg" for i, _ in ids}
        targets = {i: f"{prefix}{self._TARGET_DIR}/{i}{self._TARGET_EXT}" for i, _ in ids}
        found = stat_files(self.root, [*images.values(), *targets.values()], retries)
        kept: list[tuple[str, int]] = []
        for i, line in ids:
            for rel in (images[i], targets[i]):
                if isinstance(found[rel], str):
                    problems.add(os.fspath(self.root / rel), f"{found[rel]} (id {i!r} in {set_rel}, line {line})",
                                 fix='Put the file there, or pass on_error="skip" to leave the sample out')
                    break
            else:
                kept.append((i, line))
        kept = self._parse(kept, targets, problems)

        self.ids = [i for i, _ in kept]
        self.paths = [images[i] for i in self.ids]
        self.targets = [targets[i] for i in self.ids]
        set_st = retry(lambda: os.stat(self.root / set_rel), retries)
        used = dict.fromkeys(found[rel] for rel in (*self.paths, *self.targets))
        self.files = [FileEntry(set_rel, set_st.st_size, set_st.st_mtime_ns)]
        self.files += [entry for entry in used if isinstance(entry, FileEntry)]
        self.skipped = problems.skipped
        self.info = {"year": voc.name[3:], "split": split, "image_set": set_rel}

    def _parse(self, kept: list[tuple[str, int]], targets: dict[str, str], problems: Problems) -> list[tuple[str, int]]:
        return kept

    def _read(self, rel: str) -> bytes:
        return retry(lambda: read_regular(self.root / rel), self.retries)

    packs_split = True  # the image set packed

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if the folder is (or holds) a ``VOCdevkit/VOC20xx`` tree with ``ImageSets/<Main or Segmentation>``."""
        tree = tree_of(tree)
        return any(tree.is_dir(f"{voc}/ImageSets/{cls._SPLITS_DIR}".lstrip("/")) for voc in voc_trees(tree))

    def describe(self) -> str:
        return f"{self.name} layout (VOC{self.info['year']}, {self.info['split']}), {len(self)} images"


@register
class VOCDetection(_VOCBase):
    """Pascal VOC detection (arguments: :class:`_VOCBase`): ``ImageSets/Main/<split>.txt``.

    Every XML is parsed in the constructor with ``defusedxml`` (no DTDs or entities); one over
    ``MAX_XML_BYTES``, deeper than ``MAX_DEPTH``, malformed or not ``<annotation>`` is its sample's problem.
    ``layout[i]`` is ``{"image": ImageFile, "target": dict}``, the target as
    ``torchvision.datasets.VOCDetection.parse_voc_xml`` gives it.
    """

    name = "voc-detection"
    _SPLITS_DIR, _TARGET_DIR, _TARGET_EXT = "Main", "Annotations", ".xml"

    def _parse(self, kept: list[tuple[str, int]], targets: dict[str, str], problems: Problems) -> list[tuple[str, int]]:
        def one(i: str) -> Union[dict, LayoutError]:
            try:
                return read_voc_xml(self.root / targets[i], self.retries)
            except LayoutError as exc:
                return exc

        parsed = parallel(one, [i for i, _ in kept])
        self.parsed: list[dict] = []
        out = []
        for (i, line), value in zip(kept, parsed):
            if isinstance(value, LayoutError):
                problems.add(value.path, value.why, value.line)
            else:
                out.append((i, line))
                self.parsed.append(value)
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        rel = self.paths[index]
        return {"image": ImageFile(self._read(rel), rel), "target": self.parsed[index]}


@register
class VOCSegmentation(_VOCBase):
    """Pascal VOC segmentation (arguments: :class:`_VOCBase`): ``ImageSets/Segmentation/<split>.txt``;
    ``layout[i]`` is ``{"image": ImageFile(kind="image"), "mask": ImageFile(kind="mask")}``.
    """

    name = "voc-segmentation"
    _SPLITS_DIR, _TARGET_DIR, _TARGET_EXT = "Segmentation", "SegmentationClass", ".png"

    def __getitem__(self, index: int) -> dict[str, Any]:
        rel, mask = self.paths[index], self.targets[index]
        return {"image": ImageFile(self._read(rel), rel, kind="image"),
                "mask": ImageFile(self._read(mask), mask, kind="mask")}


def voc_trees(tree: Tree) -> list[str]:
    """Where in ``tree`` its ``VOC20xx`` folders are, by year (``""``: it is one)."""
    if YEAR_DIR.fullmatch(tree.name) and tree.is_dir("ImageSets"):
        return [""]
    found: dict[str, str] = {}
    if tree.is_dir(TRAINVAL_2011):
        found["VOC2011"] = TRAINVAL_2011
    devkit = "VOCdevkit" if tree.is_dir("VOCdevkit") else ""
    for name, is_dir in tree.entries(devkit).items():
        if YEAR_DIR.fullmatch(name) and is_dir:
            found.setdefault(name, f"{devkit}/{name}".lstrip("/"))
    return [found[name] for name in sorted(found)]


def voc_folders(root: Path) -> list[Path]:
    """The ``VOC20xx`` folders ``root`` is or holds (see `voc_trees`)."""
    return [root / rel if rel else root for rel in voc_trees(tree_of(root))]


def find_voc(root: Path, year: Union[str, int, None]) -> Path:
    """The ``VOC<year>`` folder of ``root`` (the only one where ``year`` is None).

    Raises:
        LayoutNotFoundError: there is none, or not that year.
        LayoutError: several and no ``year``.
    """
    folders = voc_folders(root)
    names = [p.name for p in folders]
    if not folders:
        raise LayoutNotFoundError(root, "is not a Pascal VOC tree: no VOCdevkit/VOC20xx folder with ImageSets",
                                  fix="Pass the folder holding VOCdevkit (or, for 2011, TrainVal), VOCdevkit "
                                      "itself, or a VOC20xx folder")
    if year is not None:
        if f"VOC{year}" not in names:
            raise LayoutNotFoundError(root, f"has no VOC{year} folder (it has {', '.join(names)})",
                                      fix="Pass another year=")
        return folders[names.index(f"VOC{year}")]
    if len(folders) > 1:
        raise LayoutError(root, f"holds several years ({', '.join(names)})",
                          fix=f"Pass year=, e.g. year={names[-1][3:]!r}")
    return folders[0]


def read_ids(path: Path, retries: int, problems: Problems) -> list[tuple[str, int]]:
    """The ids an image set file lists, with their line numbers, as torchvision strips them."""
    data = read_limited(path, MAX_ANNOTATION_BYTES, retries)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LayoutError(path, "is not UTF-8 text", line) from exc
    ids = []
    for n, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        i = raw.strip()
        if not i:
            continue
        if safe_rel(i) != i or "/" in i:
            problems.add(os.fspath(path), f"id {i!r} is not a plain file name (a '/', '..', or hidden)", n)
        else:
            ids.append((i, n))
    return ids


def read_voc_xml(path: Path, retries: int) -> dict[str, Any]:
    """The VOC annotation XML ``path`` parsed as :func:`parse_voc_xml` does.

    Raises:
        LayoutError: the file is over ``MAX_XML_BYTES``, malformed (with its line), declares a DTD
            or entities, nests deeper than ``MAX_DEPTH``, or its root is not ``<annotation>``.
    """
    data = read_limited(path, MAX_XML_BYTES, retries)
    try:
        node = defusedxml.ElementTree.fromstring(data, forbid_dtd=True)
    except ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else None
        raise LayoutError(path, f"is not valid XML ({str(exc).split(':')[0]})", line, fix="Export it again") from exc
    except defusedxml.DefusedXmlException as exc:
        raise LayoutError(path, f"is refused: {exc} (a DTD or entities, which a VOC annotation never needs)") from exc
    if xml_depth(node) > MAX_DEPTH:
        raise LayoutError(path, f"nests elements more than {MAX_DEPTH} deep, more than colabfast parses",
                          fix="A VOC annotation nests 4 deep; check that it is the right file")
    if node.tag != "annotation":
        raise LayoutError(path, f"is not a VOC annotation: its root element is <{node.tag}>, not <annotation>")
    return parse_voc_xml(node)


def xml_depth(node: Element) -> int:
    """How deep the elements under ``node`` nest (``node`` alone: 1), without recursion; walks no
    deeper than ``MAX_DEPTH + 1``."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        if d <= MAX_DEPTH:  # no need to walk further down
            stack.extend((c, d + 1) for c in n)
    return deepest


def parse_voc_xml(node: Element) -> dict[str, Any]:
    """An XML element as a dict: torchvision's ``VOCDetection.parse_voc_xml``, copied (BSD-3-Clause)."""
    voc_dict: dict[str, Any] = {}
    children = list(node)
    if children:
        def_dic: dict[str, Any] = collections.defaultdict(list)
        for dc in map(parse_voc_xml, children):
            for ind, v in dc.items():
                def_dic[ind].append(v)
        if node.tag == "annotation":
            def_dic["object"] = [def_dic["object"]]
        voc_dict = {node.tag: {ind: v[0] if len(v) == 1 else v for ind, v in def_dic.items()}}
    if node.text:
        text = node.text.strip()
        if not children:
            voc_dict[node.tag] = text
    return voc_dict

