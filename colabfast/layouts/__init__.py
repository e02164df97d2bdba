"""Every source layout colabfast packs and opens, and their registry (`colabfast.layouts.registry`).

A layout is one class: a `Layout` (a folder read as a map-style dataset, packed into a mirror of
typed columns and opened as `colabfast.H5Dataset` or a drop-in: COCO, Pascal VOC, YOLO, image/mask
pairs, CSV tables), an `ImageLayout` (a folder listed into an image mirror: ImageFolder, KITTI, plain
files) or an `ArchiveLayout` (ImageNet's and Kaggle's archives, read as one stream). What a source is
made of is seen as a `colabfast.layouts.tree.Tree`, the same for a folder and an archive of it. A new
layout is one new module holding one class that `register` registers.
"""

from colabfast.layouts.base import (
    BaseLayout,
    ImageFile,
    Layout,
    LayoutError,
    LayoutFileNotFoundError,
    LayoutNotFoundError,
)
from colabfast.layouts.registry import (
    LAYOUTS,
    REGISTRY,
    detect_layout,
    drop_in_of,
    layout_class,
    register,
    register_drop_in,
    unregister,
)

# The built-in layouts register themselves when imported; layout="auto" asks those of columns in this
# order (a VOC tree with both image sets is packed for detection; csv last: one table at the top of a
# folder of images).
# isort: off
from colabfast.layouts.images import ImageLayout, ImageFolderLayout, FilesLayout, KittiLayout
from colabfast.layouts.coco import Coco
from colabfast.layouts.voc import VOCDetection, VOCSegmentation
from colabfast.layouts.yolo import Yolo
from colabfast.layouts.segmentation import Segmentation
from colabfast.layouts.table import Csv
from colabfast.layouts.imagenet import ArchiveLayout, ImageNetTrain, ImageNetVal, KaggleTrain, KaggleVal
# isort: on

__all__ = ["BaseLayout", "ImageFile", "Layout", "ImageLayout", "ArchiveLayout", "LayoutError",
           "LayoutFileNotFoundError", "LayoutNotFoundError", "LAYOUTS", "REGISTRY", "register", "unregister",
           "layout_class", "detect_layout", "register_drop_in", "drop_in_of", "ImageFolderLayout", "FilesLayout",
           "KittiLayout", "Coco", "VOCDetection", "VOCSegmentation", "Yolo", "Segmentation", "Csv", "ImageNetTrain",
           "ImageNetVal", "KaggleTrain", "KaggleVal"]
