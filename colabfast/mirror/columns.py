"""Samples as typed columns: how a mirror of any map-style dataset stores what ``dataset[i]`` returned.

A sample is cut into fields, each stored in one column of one kind (image, mask, int, float, bool, str,
bytes, ndarray, ragged, json) and put back together in the same shape when read; the kinds, None values
and limits are specified in [The mirror format](../mirror-format.md#versions-3-and-4-a-mirror-of-columns).
Images are stored as ``datasets`` stores them (``datasets/features/image.py``, ``image_to_bytes``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import reprlib
from typing import Any, Optional, Union

import numpy as np
import torch
from PIL import Image

from colabfast.errors import FieldError
from colabfast.mirror.encoding import ImageFile

__all__ = ["FieldError", "Field", "Template", "flatten", "unflatten", "KINDS", "MAX_JSON_BYTES", "MAX_DEPTH",
           "MAX_TEMPLATE_DEPTH", "RETURNS", "spec_problem"]

KINDS = ("image", "mask", "int", "float", "bool", "str", "bytes", "ndarray", "ragged", "json")
IMAGE_KINDS = ("image", "mask")
NULLABLE = ("image", "mask", "int", "float", "bool", "str", "bytes")  # kinds whose None a nulls array records
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")  # modes PNG holds exactly: PIL gives them back as they were
LOSSLESS = ("PNG", "TIFF")  # what an image is encoded as, in that order, as datasets' image_to_bytes does
# A None image's placeholder: the smallest PNG (1x1 grey, MIN_ENCODED_BYTES), so every reader of the
# column decodes it as any image; the nulls array makes it None
NULL_IMAGE = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b55"
                           "0000000a49444154789c636000000002000148afa4710000000049454e44ae426082")
MAX_JSON_BYTES = 16 << 20  # one sample's JSON: COCO's densest image has a few hundred KB of annotations
ENCODINGS = ("png", "jpeg")  # what ``fields`` may ask of an image field (JPEG lossy, at ``quality``)
MAX_TEMPLATE_DEPTH = 8  # tuples and dicts nested as fields: what valid_spec reads back
MAX_DEPTH = 64  # lists, tuples and dicts nested in one sample: far inside Python's recursion limit, so that
# json.dumps when packing and json.loads when reading (in any thread's stack) never raise RecursionError


@dataclasses.dataclass
class Field:
    """One column: ``name`` (the field's path, e.g. ``"1.boxes"``), ``kind`` (of :data:`KINDS`; ``"array"``
    until packing decides), ``as_`` (what the reader returns), ``dtype``, ``shape`` and ``meta``.
    """

    name: str
    kind: str
    as_: str
    dtype: Optional[str] = None
    shape: Optional[list[int]] = None
    meta: dict = dataclasses.field(default_factory=dict)

    def spec(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "as": self.as_}
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.shape is not None:
            out["shape"] = self.shape
        if self.meta:
            out["meta"] = self.meta
        return out

    @staticmethod
    def from_spec(spec: dict) -> Field:
        return Field(spec["name"], spec["kind"], spec["as"], spec.get("dtype"), spec.get("shape"),
                     spec.get("meta") or {})


# A template is the sample's shape with columns at its leaves, as JSON: {"column": k} (index into the
# fields), {"tuple": [...]}, {"dict": [[key, ...], ...]}.
Template = dict


def _is_tv(value: Any, name: str) -> bool:
    cls = type(value)
    return cls.__name__ == name and cls.__module__.startswith("torchvision.tv_tensors")


def _describe(value: Any) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"{type(value).__name__} {getattr(value, 'dtype', '')} {list(value.shape)}"
    if isinstance(value, Image.Image):
        return f"PIL image mode {value.mode} {value.size[0]}x{value.size[1]}"
    return type(value).__name__


def classify(value: Any, name: str, requested: Optional[str] = None) -> Field:
    """The column a first sample's value ``value`` at field ``name`` makes (``requested``: the
    caller's ``fields`` entry: a kind, or ``"jpeg"``/``"png"`` for an image)."""
    if requested in ENCODINGS:
        field = classify(value, name)
        if field.kind not in IMAGE_KINDS:
            raise FieldError(f"fields={{{name!r}: {requested!r}}} asks to encode field {name!r} as an image, "
                             f"but it holds {_describe(value)}")
        field.meta["encoding"] = requested
        return field
    if requested == "json":
        if value is None or isinstance(value, (str, bool, int, float, list, dict)):
            return Field(name, "json", "python")
        raise FieldError(f"fields={{{name!r}: 'json'}} asks to store field {name!r} as JSON, but it holds "
                         f"{_describe(value)}, which JSON cannot hold: leave that field out of fields")
    if value is None and requested in NULLABLE:  # the kind named, its None recorded by the nulls array
        return Field(name, requested, "pil" if requested in IMAGE_KINDS else "python")
    if isinstance(value, ImageFile):  # a layout's file: an image is read as torchvision reads it, in RGB
        return Field(name, value.kind, "pil", meta={"rgb": True} if value.kind == "image" and not value.keep else {})
    if isinstance(value, Image.Image):
        kind = "mask" if value.mode == "P" or requested == "mask" else "image"
        return Field(name, kind, "pil")
    if isinstance(value, torch.Tensor):
        if _is_tv(value, "BoundingBoxes"):
            fmt = getattr(value.format, "name", str(value.format))  # type: ignore[attr-defined]
            return Field(name, "array", "BoundingBoxes", str(value.dtype).replace("torch.", ""),
                         meta={"format": fmt})
        tv = type(value).__name__ if _is_tv(value, type(value).__name__) else None
        if tv == "Image" or (tv is None and requested in (None, "image") and _image_like(value, chw=True)):
            if _image_like(value, chw=True):
                return Field(name, "image", tv or "tensor")
        if tv not in (None, "Image", "Mask", "Video"):
            raise FieldError(f"field {name!r} holds a torchvision {tv}, which pack cannot store yet: convert it "
                             "to a plain tensor (torch.Tensor(x)) in your dataset")
        return Field(name, "array", tv or "tensor", str(value.dtype).replace("torch.", ""))
    if isinstance(value, np.ndarray):
        if requested in (None, "image") and _image_like(value, chw=False):
            return Field(name, "image", "ndarray")
        _check_dtype(value.dtype, name)
        return Field(name, "array", "ndarray", value.dtype.str if value.dtype != bool else "bool")
    if isinstance(value, (bool, np.bool_)):
        return Field(name, "bool", "numpy" if isinstance(value, np.bool_) else "python")
    if isinstance(value, (int, np.integer)):
        return Field(name, "int", "numpy" if isinstance(value, np.integer) else "python",
                     value.dtype.str if isinstance(value, np.integer) else None)
    if isinstance(value, (float, np.floating)):
        return Field(name, "float", "numpy" if isinstance(value, np.floating) else "python",
                     value.dtype.str if isinstance(value, np.floating) else None)
    if isinstance(value, str):
        return Field(name, "str", "python")
    if isinstance(value, (bytes, bytearray)):
        return Field(name, "bytes", "python")
    if value is None or isinstance(value, (list, dict)):
        return Field(name, "json", "python")
    raise FieldError(f"field {name!r} holds {_describe(value)}, which no column kind holds (pack stores images, "
                     "numbers, strings, bytes, arrays, tensors and JSON-like lists/dicts; nothing is pickled): "
                     "return one of those from your dataset")


def _image_like(x: Union[torch.Tensor, np.ndarray], chw: bool) -> bool:
    if x.dtype not in (torch.uint8, np.uint8) or x.ndim != 3:
        return False
    c = x.shape[0] if chw else x.shape[2]
    return c in (1, 3, 4) and min(x.shape) > 0


def _check_dtype(dtype: np.dtype, name: str) -> None:
    if dtype.kind not in "uifb" or dtype.itemsize > 8 or dtype.names is not None:
        raise FieldError(f"field {name!r} holds an array of dtype {dtype}, which a mirror cannot store (numbers "
                         "and bools only, nothing is pickled): convert it, or return a list (stored as JSON)")


# --- cutting a sample into fields -----------------------------------------------------------------


def template_of(sample: Any, fields: Optional[dict] = None,
                defaults: Optional[dict] = None) -> tuple[Template, list[Field]]:
    """The template and fields of a first ``sample`` (``fields``: the caller's overrides by name;
    ``defaults``: the kind of a field by name where its value is None, as a Hugging Face feature says)."""
    out: list[Field] = []
    wanted = {str(k): v for k, v in (fields or {}).items()}
    defaults = defaults or {}
    if _deeper(sample, MAX_DEPTH):  # before anything below recurses into it
        raise FieldError(f"sample 0 nests lists, tuples or dicts more than {MAX_DEPTH} levels deep, more than a "
                         "mirror holds (mirror.columns.MAX_DEPTH): flatten it in your dataset, or return the deep "
                         "part as a str (json.dumps) or bytes")

    def walk(value: Any, name: str, depth: int) -> Template:
        if isinstance(value, tuple) and not _is_namedtuple(value) or isinstance(value, dict) and value and all(
                isinstance(k, str) for k in value) and name.count(".") < 3 and not _json_leafy(value):
            if depth >= MAX_TEMPLATE_DEPTH:
                raise FieldError(f"sample 0: field {name!r} is a {type(value).__name__} nested {depth} levels deep "
                                 f"in the sample, and a mirror holds tuples and dicts of fields {MAX_TEMPLATE_DEPTH} "
                                 "levels deep (mirror.columns.MAX_TEMPLATE_DEPTH): flatten the sample, or return "
                                 "the deep part as lists (stored as JSON)")
            if isinstance(value, tuple):
                return {"tuple": [walk(v, _join(name, str(i)), depth + 1) for i, v in enumerate(value)]}
            return {"dict": [[k, walk(v, _join(name, k), depth + 1)] for k, v in value.items()]}
        field = classify(value, name or "0", wanted.pop(name or "0", None) or (
            defaults.get(name or "0") if value is None else None))
        out.append(field)
        if field.as_ == "BoundingBoxes":  # each sample's canvas (H, W), in a column of its own
            out.append(Field(_join(name or "0", "canvas_size"), "array", "hidden", "<i8"))
            field.meta["canvas"] = len(out) - 1
        return {"column": len(out) - 1 - (1 if field.as_ == "BoundingBoxes" else 0)}

    template = walk(sample, "", 0)
    if wanted:
        raise FieldError(f"fields names {', '.join(map(repr, wanted))}, which the first sample does not have (its "
                         f"fields: {', '.join(f.name for f in out)})")
    return template, out


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


def _is_namedtuple(x: Any) -> bool:
    return hasattr(x, "_fields")


def _deeper(value: Any, limit: int) -> bool:
    """Whether lists, tuples and dicts nest in ``value`` more than ``limit`` levels deep (a list holding
    itself does): walked a level at a time, so no depth of nesting reaches Python's recursion limit."""
    level, depth = [value], 0
    while True:
        containers = [v for v in level if isinstance(v, (list, tuple, dict))]
        if not containers:
            return False
        depth += 1
        if depth > limit:
            return True
        level = [x for v in containers for x in (v.values() if isinstance(v, dict) else v)]


def _json_leafy(d: dict) -> bool:
    """A dict whose values are all JSON scalars, lists or dicts (a parsed XML, a COCO annotation) is
    one JSON field, not a column per key."""
    def plain(v: Any) -> bool:
        return v is None or isinstance(v, (str, bool, int, float, list)) or (isinstance(v, dict) and all(
            isinstance(k, str) and plain(x) for k, x in v.items()))
    return all(plain(v) and isinstance(v, (list, dict)) for v in d.values())


def flatten(sample: Any, template: Template, fields: list[Field], index: int) -> list[Any]:
    """The values of ``sample``'s fields in column order, checked against the template.

    Raises:
        FieldError: a missing or new key, a tuple of another length, a value of another kind.
    """
    values: list[Any] = [None] * len(fields)
    _place(sample, template, "", values, fields, index)
    return values


def _place(value: Any, t: Template, name: str, values: list[Any], fields: list[Field], index: int) -> None:
    """:func:`flatten`'s walk: a module function, since a nested function that calls itself is a reference
    cycle, which held ``values`` (the sample's memory) until the garbage collector ran."""
    if "tuple" in t:
        if not isinstance(value, tuple) or len(value) != len(t["tuple"]):
            raise _misfit(index, name or "sample", f"a tuple of {len(t['tuple'])}", value)
        for i, (v, sub) in enumerate(zip(value, t["tuple"])):
            _place(v, sub, _join(name, str(i)), values, fields, index)
    elif "dict" in t:
        keys = [k for k, _ in t["dict"]]
        if not isinstance(value, dict) or list(value) != keys and set(value) != set(keys):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise _misfit(index, name or "sample", f"a dict with keys {keys}", got)
        for k, sub in t["dict"]:
            _place(value[k], sub, _join(name, k), values, fields, index)
    else:
        k = t["column"]
        values[k] = value
        f = fields[k]
        if f.as_ == "BoundingBoxes":
            values[f.meta["canvas"]] = np.asarray(getattr(value, "canvas_size", (0, 0)), dtype=np.int64)


def _misfit(index: int, name: str, wanted: str, got: Any) -> FieldError:
    return FieldError(f"sample {index}: field {name!r} should be {wanted} (as in sample 0), but it is "
                      f"{reprlib.repr(got)}: every sample of a dataset must have the same fields")  # a bounded repr


# --- one value to what a column stores -------------------------------------------------------------


def encode(value: Any, field: Field, index: int, image_options: dict) -> Any:
    """What column ``field`` stores for sample ``index``'s ``value``: ``(bytes, (H, W, C), own)`` for an
    image or mask, bytes for str/bytes/json, a number, or an ndarray; a placeholder for None in a
    :data:`NULLABLE` column. ``image_options``: ``store``, ``image_size`` and ``quality`` as :func:`colabfast.pack`.

    Raises:
        FieldError: the value does not fit the field's kind.
        Exception: what PIL raises for an image file it cannot read (the caller reports it).
    """
    kind, name = field.kind, field.name
    if value is None and kind in NULLABLE:
        return (NULL_IMAGE, (1, 1, 1), False) if kind in IMAGE_KINDS else {"str": b"", "bytes": b""}.get(kind, 0)
    if kind in IMAGE_KINDS:
        if isinstance(value, ImageFile):
            return _image_file(value, image_options)
        return _image(value, field, index)
    if kind == "int":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise _kind(index, field, value)
        if not -(1 << 63) <= int(value) < (1 << 63):
            raise FieldError(f"sample {index}: field {name!r} is {value}, outside int64: store it as a str")
        return int(value)
    if kind == "float":
        if not isinstance(value, (float, np.floating, int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise _kind(index, field, value)
        return float(value)
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise _kind(index, field, value)
        return bool(value)
    if kind == "str":
        if not isinstance(value, str):
            raise _kind(index, field, value)
        return value.encode("utf-8", "surrogatepass")
    if kind == "bytes":
        if not isinstance(value, (bytes, bytearray)):
            raise _kind(index, field, value)
        return bytes(value)
    if kind == "json":
        if _deeper(value, MAX_DEPTH):
            raise FieldError(f"sample {index}: field {name!r} nests lists and dicts more than {MAX_DEPTH} levels deep, "
                             "more than a mirror holds (mirror.columns.MAX_DEPTH): flatten it in your dataset, or "
                             "return it as a str (json.dumps)")
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=True, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise FieldError(f"sample {index}: field {name!r} cannot be stored as JSON ({exc}): return lists, "
                             "dicts with str keys, numbers, strings and None there") from None
        data = text.encode("utf-8", "surrogatepass")
        if len(data) > MAX_JSON_BYTES:
            raise FieldError(f"sample {index}: field {name!r} is {len(data)} bytes of JSON, more than the "
                             f"{MAX_JSON_BYTES} a sample's JSON may hold: store it as arrays")
        return data
    # arrays
    if field.as_ == "hidden":
        return value
    if isinstance(value, torch.Tensor):
        if field.as_ in ("ndarray",) or str(value.dtype).replace("torch.", "") != field.dtype:
            raise _kind(index, field, value)
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            raise FieldError(f"sample {index}: field {name!r} is bfloat16, which NumPy cannot hold: convert it")
        return t.numpy()
    # "tensor" with a NumPy dtype ("<f4"): a layout's ndarray targets, which pack has its readers return as
    # tensors; a column of a dataset's tensors has a torch dtype ("float32"), so an ndarray stays refused there
    if isinstance(value, np.ndarray) and field.as_ in ("ndarray", "tensor"):
        if (value.dtype.str if value.dtype != bool else "bool") != field.dtype:
            raise _kind(index, field, value)
        return np.ascontiguousarray(value)
    raise _kind(index, field, value)


def _kind(index: int, field: Field, value: Any) -> FieldError:
    want = field.kind if field.kind != "array" else f"{field.as_} of dtype {field.dtype}"
    return FieldError(f"sample {index}: field {field.name!r} is {_describe(value)}, but sample 0 made it a {want} "
                      "column: every sample must give each field the same kind (and arrays the same dtype)")


def _image_file(f: Any, options: dict) -> tuple[bytes, tuple[int, int, int], bool]:
    """A layout's or Hugging Face dataset's image or mask file as the mirror stores it (:func:`encode`'s triple).

    Raises:
        ImageSizeError, ValueError: too many pixels, bytes PIL cannot decode, or a mode neither PNG nor TIFF keeps.
    """
    from colabfast.images.decode import check_encoded
    from colabfast.mirror.encoding import encode_image

    if f.kind == "image" and not f.keep:  # read back in RGB, as torchvision converts it: no format
        return (*encode_image(f.data, "encoded" if options.get("store") != "raw" else "raw",
                              options.get("image_size"), options.get("quality") or 90, f.orient), False)
    check_encoded(np.frombuffer(f.data, np.uint8), str(f.path))  # the header's pixels, before PIL decodes any
    try:
        img = Image.open(io.BytesIO(f.data))
        img.load()
    except Exception as exc:  # PIL raises many types for bad bytes
        raise ValueError(f"cannot decode the image at {f.path} ({len(f.data)} bytes): {exc!r}"[:400]) from None
    with img:
        bands = len(img.getbands())
        shape = (img.height, img.width, bands)
        # decoded above: whole and readable. A file kept as it is (any format PIL reads: a Hugging Face
        # dataset decodes its bytes just so) comes back as PIL opens it, with its mode and format
        if f.keep or img.format == "PNG" and img.mode in PNG_MODES:
            return f.data, shape, True
        return _lossless(img), shape, False


def _lossless(img: Image.Image) -> bytes:
    """``img`` encoded as ``datasets``'s ``image_to_bytes``: PNG, else TIFF, the first that keeps its mode and
    pixels exactly. Raises ValueError where neither holds it (``HSV``, ``RGBa``).
    """
    for fmt in LOSSLESS:
        out = io.BytesIO()
        try:
            img.save(out, format=fmt, **({"optimize": False, "compress_level": 1} if fmt == "PNG" else {}))
        except (OSError, ValueError, KeyError):  # PIL writes no such mode in that format
            continue
        data = out.getvalue()
        if fmt == "PNG" and img.mode in PNG_MODES:
            return data
        with Image.open(io.BytesIO(data)) as again:
            again.load()
            if again.mode == img.mode and again.size == img.size and again.tobytes() == img.tobytes():
                return data
    raise ValueError(f"an image in mode {img.mode}, which neither PNG nor TIFF holds exactly")


def _image(value: Any, field: Field, index: int) -> tuple[bytes, tuple[int, int, int], bool]:
    """An image encoded losslessly (JPEG where asked), or a JPEG file's own bytes, and whether it keeps its format."""
    if isinstance(value, Image.Image):
        if field.as_ != "pil":
            raise _kind(index, field, value)
        _check_pixels(value.height, value.width, f"sample {index}, field {field.name!r},")
        img = value
    elif isinstance(value, torch.Tensor) and field.as_ != "ndarray" and _image_like(value, chw=True):
        _check_pixels(value.shape[1], value.shape[2], f"sample {index}, field {field.name!r},")  # before any copy
        hwc = value.detach().cpu().permute(1, 2, 0).contiguous().numpy()
        img = Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc)
    elif isinstance(value, np.ndarray) and field.as_ == "ndarray" and _image_like(value, chw=False):
        _check_pixels(value.shape[0], value.shape[1], f"sample {index}, field {field.name!r},")
        img = Image.fromarray(value[:, :, 0] if value.shape[2] == 1 else np.ascontiguousarray(value))
    else:
        raise _kind(index, field, value)
    shape = (img.height, img.width, len(img.getbands()))
    had = value.format if isinstance(value, Image.Image) else None
    encoding = field.meta.get("encoding")
    if encoding != "png" and (own := _jpeg_file_bytes(img)) is not None:
        return own, shape, True
    out = io.BytesIO()
    if encoding == "jpeg":
        if img.mode not in ("RGB", "L"):
            raise FieldError(f"sample {index}: field {field.name!r} is a {img.mode} image, which JPEG cannot "
                             "hold: ask for 'png' there")
        img.save(out, format="JPEG", quality=field.meta.get("quality", 90))
        return out.getvalue(), shape, had == "JPEG"
    try:
        data = _lossless(img)
    except ValueError:
        raise FieldError(f"sample {index}: field {field.name!r} is a PIL image in mode {img.mode}, which neither PNG "
                         "nor TIFF holds exactly: return it as an array (np.asarray(image))") from None
    return data, shape, had == ("PNG" if data.startswith(b"\x89PNG") else "TIFF")


def _check_pixels(h: int, w: int, where: str) -> None:
    """Refuse (ImageSizeError) an image over ``PIL.Image.MAX_IMAGE_PIXELS`` before it is encoded."""
    from colabfast.images.decode import check_pixels

    check_pixels(int(h), int(w), where)


def _jpeg_file_bytes(img: Image.Image) -> Optional[bytes]:
    """The bytes of the JPEG file a PIL image was opened from, if its pixels are still exactly that
    file's (checked by decoding it again: a transform may have changed them in place)."""
    path = getattr(img, "filename", "")
    if img.format != "JPEG" or not path or img.mode not in ("RGB", "L"):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as again:
            same = again.mode == img.mode and again.size == img.size and again.tobytes() == img.tobytes()
    except Exception:  # the file moved or changed: the pixels are stored as PNG instead
        return None
    return data if same else None


# --- reading a value back -----------------------------------------------------------------------------


def image_value(decoded: Union[np.ndarray, Image.Image], field: Field) -> Any:
    """A decoded image (uint8 HWC ndarray, or a PIL image) as the field returns it."""
    if isinstance(decoded, Image.Image):
        if field.as_ == "pil":
            return decoded
        decoded = np.array(decoded)  # writable: a tensor may be made of it
        if decoded.ndim == 2:
            decoded = decoded[:, :, None]
    if field.as_ == "ndarray":
        return decoded
    chw = torch.from_numpy(np.ascontiguousarray(decoded)).permute(2, 0, 1)
    if field.as_ == "Image":
        from torchvision import tv_tensors

        return tv_tensors.Image(chw)
    return chw


def array_value(arr: np.ndarray, field: Field, canvas: Optional[np.ndarray] = None) -> Any:
    """A stored array as the field returns it (a copy of its own)."""
    if field.dtype == "bool":
        arr = arr.astype(bool)
    if field.as_ == "ndarray":
        return np.array(arr)
    t = torch.from_numpy(np.array(arr))
    if field.as_ == "tensor" or field.as_ == "hidden":
        return t
    from torchvision import tv_tensors

    if field.as_ == "BoundingBoxes":
        assert canvas is not None
        return tv_tensors.BoundingBoxes(t, format=field.meta["format"], canvas_size=tuple(int(v) for v in canvas))
    return getattr(tv_tensors, field.as_)(t)


def scalar_value(v: Any, field: Field) -> Any:
    if field.as_ == "numpy":
        return np.dtype(field.dtype or ("?" if field.kind == "bool" else "<f8")).type(v)
    if field.kind == "int":
        return int(v)
    if field.kind == "float":
        return float(v)
    return bool(v)


def json_value(data: bytes) -> Any:
    return json.loads(data.decode("utf-8", "surrogatepass"))


def unflatten(values: list[Any], template: Template) -> Any:
    """A sample from its fields' values (the inverse of :func:`flatten`)."""
    if "tuple" in template:
        return tuple(unflatten(values, t) for t in template["tuple"])
    if "dict" in template:
        return {k: unflatten(values, t) for k, t in template["dict"]}
    return values[template["column"]]


# What a column's "as" may name, by kind: exactly what pack writes (classify, template_of, and pack_columns'
# "ndarray" -> "tensor" for layouts). The reader turns "as" into a call (a torchvision class by name), so a
# mirror's "as" is looked up here and nowhere else: a forged one ("wrap", "__class__") is refused at open.
RETURNS: dict[str, tuple[str, ...]] = {
    "image": ("pil", "tensor", "ndarray", "Image"),
    "mask": ("pil",),
    "int": ("python", "numpy"),
    "float": ("python", "numpy"),
    "bool": ("python", "numpy"),
    "str": ("python",),
    "bytes": ("python",),
    "json": ("python",),
    "ndarray": ("tensor", "ndarray", "hidden", "BoundingBoxes", "Image", "Mask", "Video"),
    "ragged": ("tensor", "ndarray", "hidden", "BoundingBoxes", "Image", "Mask", "Video"),
}
SCALAR_DTYPES = {"int": "iu", "float": "f", "bool": "b"}  # NumPy scalars' dtype kinds, by column kind


def spec_problem(spec: Any) -> Optional[str]:
    """What is wrong with a mirror's ``columns`` attribute, or None where it is well formed."""
    if not isinstance(spec, dict) or not isinstance(spec.get("fields"), list) or len(spec["fields"]) > 1000:
        return "its columns attribute is not a list of at most 1000 fields"
    fields = spec["fields"]
    for k, f in enumerate(fields):
        if not (isinstance(f, dict) and isinstance(f.get("name"), str) and f.get("kind") in KINDS
                and isinstance(f.get("as"), str) and isinstance(f.get("meta") or {}, dict)):
            return f"column {k} is not a field with a name, a kind of {', '.join(KINDS)}, an 'as' and a meta dict"
        where, kind, as_ = f"column {k} ({f['name'][:80]!r})", f["kind"], f["as"]
        if as_ not in RETURNS[kind]:
            return (f"{where}, of kind {kind}, is returned as {as_[:80]!r}, which pack never writes for that kind "
                    f"(it writes {', '.join(RETURNS[kind])})")
        if kind in ("ndarray", "ragged") and not (
                isinstance(f.get("dtype"), str) and isinstance(f.get("shape"), list)
                and all(isinstance(d, int) and 0 <= d < (1 << 31) for d in f["shape"]) and len(f["shape"]) <= 8):
            return f"{where} has no dtype, or a shape that is not at most 8 sizes"
        if as_ == "numpy" and not _scalar_dtype(f.get("dtype"), SCALAR_DTYPES[kind]):
            return f"{where} is a NumPy {kind} of dtype {repr(f.get('dtype'))[:40]}, not one of that kind"
        if as_ == "BoundingBoxes" and (problem := _boxes_problem(f.get("meta") or {}, fields)):
            return f"{where}: {problem}"
        for flag, kinds in (("nulls", NULLABLE), ("formats", IMAGE_KINDS)):  # each names an array of its column
            if flag in (f.get("meta") or {}) and (f["meta"][flag] is not True or kind not in kinds):
                return (f"{where}, of kind {kind}, has {flag} {repr(f['meta'][flag])[:40]}: pack writes it only as "
                        f"true, for kinds {', '.join(kinds)}")
    seen: set[int] = set()

    def ok(t: Any, depth: int) -> bool:
        if depth > MAX_TEMPLATE_DEPTH or not isinstance(t, dict) or len(t) != 1:
            return False
        if "column" in t:
            k = t["column"]
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(fields) or k in seen:
                return False
            seen.add(k)
            return True
        if "tuple" in t:
            return isinstance(t["tuple"], list) and all(ok(x, depth + 1) for x in t["tuple"])
        if "dict" in t:
            return isinstance(t["dict"], list) and all(
                isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) and ok(kv[1], depth + 1)
                for kv in t["dict"])
        return False

    return None if ok(spec.get("template"), 0) else "its template is not a tuple/dict of distinct columns"


def _scalar_dtype(name: Any, kinds: str) -> bool:
    """Whether ``name`` (a NumPy scalar field's ``dtype``; None for a bool) is a plain dtype of ``kinds``."""
    if name is None:
        return kinds == "b"
    try:
        dt = np.dtype(name) if isinstance(name, str) else None
    except (TypeError, ValueError):
        return False
    return dt is not None and dt.kind in kinds and dt.shape == () and dt.names is None


def _boxes_problem(meta: dict, fields: list) -> Optional[str]:
    """What is wrong with a ``BoundingBoxes`` field's ``meta`` (``format`` and ``canvas``), or None."""
    from torchvision import tv_tensors

    formats = list(tv_tensors.BoundingBoxFormat.__members__)
    if meta.get("format") not in formats:
        return f"box format {repr(meta.get('format'))[:40]} is not one of torchvision's ({', '.join(formats)})"
    k = meta.get("canvas")
    c = fields[k] if isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(fields) else None
    # ndarray [2]; ragged [] only where pack saw no sample (decide())
    if not (isinstance(c, dict) and (c.get("kind"), c.get("shape")) in (("ndarray", [2]), ("ragged", []))
            and c.get("as") == "hidden" and c.get("dtype") == "<i8"):
        return f"canvas {repr(k)[:40]} is not the index of its hidden int64 (H, W) column"
    return None
