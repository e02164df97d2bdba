"""Every source layout colabfast packs and opens, and their registry (`colabfast.layouts.registry`).

A layout is one class, registered: a `Layout` (a folder read as a map-style dataset into a mirror of
columns), an `ImageLayout` (a folder listed into an image mirror) or an `ArchiveLayout` (archives read
as one stream). [Layouts and mirrors](../layouts.md#a-layout-of-your-own) says how to add one.
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
