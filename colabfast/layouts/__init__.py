"""Folder layouts that :func:`colabfast.pack` reads with no Dataset to write: COCO, Pascal VOC,
YOLO (Ultralytics, Roboflow), image/mask pairs and CSV tables; and the registry of every layout
(:mod:`colabfast.layouts.registry`).

Each layout is a map-style dataset over the source folder (:class:`~colabfast.layouts.base.Layout`):
made from the folder, it lists the files and parses every annotation (reading no image), then
``layout[i]`` reads sample ``i``'s files and returns its value, which the mirror stores column by
column and :class:`colabfast.H5Dataset` (or the layout's drop-in) gives back. A new layout is one
new module holding one class that :func:`register` registers.
"""

from colabfast.layouts.base import ImageFile, Layout, LayoutError, LayoutFileNotFoundError, LayoutNotFoundError
from colabfast.layouts.images import ImageLayout
from colabfast.layouts.registry import LAYOUTS, REGISTRY, drop_in_of, layout_class, register, unregister

# The built-in layouts register themselves when imported, in this order: the order layout="auto" asks
# them (a VOC tree with both image sets is packed for detection; csv last: one table at the top of a
# folder of images).
# isort: off
from colabfast.layouts.coco import Coco
from colabfast.layouts.voc import VOCDetection, VOCSegmentation
from colabfast.layouts.yolo import Yolo
from colabfast.layouts.segmentation import Segmentation
from colabfast.layouts.table import Csv
# isort: on

__all__ = ["ImageFile", "Layout", "ImageLayout", "LayoutError", "LayoutFileNotFoundError", "LayoutNotFoundError",
           "LAYOUTS", "REGISTRY", "register", "unregister", "layout_class", "drop_in_of",
           "Coco", "VOCDetection", "VOCSegmentation", "Yolo", "Segmentation", "Csv"]
