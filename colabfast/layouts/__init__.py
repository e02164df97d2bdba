"""Folder layouts that :func:`colabfast.pack` reads with no Dataset to write: COCO, Pascal VOC,
YOLO (Ultralytics, Roboflow), image/mask pairs and CSV tables.

Each layout is a map-style dataset over the source folder (:class:`~colabfast.layouts.base.Layout`):
made from the folder, it lists the files and parses every annotation (reading no image), then
``layout[i]`` reads sample ``i``'s files and returns its value, which the mirror stores column by
column and :class:`colabfast.H5Dataset` (or the layout's drop-in) gives back. A new layout is one
new module here, added to :data:`LAYOUTS`.
"""

from colabfast.layouts.base import ImageFile, Layout, LayoutError, LayoutFileNotFoundError, LayoutNotFoundError
from colabfast.layouts.coco import Coco
from colabfast.layouts.segmentation import Segmentation
from colabfast.layouts.table import Csv
from colabfast.layouts.voc import VOCDetection, VOCSegmentation
from colabfast.layouts.yolo import Yolo

__all__ = ["ImageFile", "Layout", "LayoutError", "LayoutFileNotFoundError", "LayoutNotFoundError", "LAYOUTS",
           "Coco", "VOCDetection", "VOCSegmentation", "Yolo",
           "Segmentation", "Csv"]

# name -> class, in the order "auto" tries them (a VOC tree with both image sets is packed for detection;
# csv last: one table at the top of a folder of images)
LAYOUTS: dict[str, type[Layout]] = {cls.name: cls for cls in (Coco, VOCDetection, VOCSegmentation, Yolo, Segmentation,
                                                              Csv)}
