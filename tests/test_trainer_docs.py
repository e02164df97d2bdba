"""docs/trainers.md, torchvision's detection references section, run as the page says on a small packed
COCO folder: the references' dataset built on the mirror gives the items ``CocoDetection`` gives, their
aspect-ratio groups and ``get_coco_api_from_dataset`` read ``.coco`` through the v2 wrapper, a ``Subset``
and ``cf.DataLoader``, ``COCOeval`` on it scores ground-truth boxes 1.0 and a shifted box less, and a
torchvision detection model takes a batch of the loader and trains a step.

The functions marked "references/detection" are the few lines of torchvision's references that the page
relies on (https://github.com/pytorch/vision/tree/main/references/detection), copied so that the test
needs no clone of torchvision."""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch

import colabfast as cf
from colabfast.testing.layouts import make_coco

torchvision = pytest.importorskip("torchvision")
pytest.importorskip("pycocotools")
from pycocotools.cocoeval import COCOeval  # noqa: E402
from torchvision.datasets import wrap_dataset_for_transforms_v2  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

TARGET_KEYS = ["boxes", "labels", "image_id"]


def collate_fn(batch):  # references/detection/utils.py
    return tuple(zip(*batch))


def remove_images_without_annotations(dataset):  # coco_utils._coco_remove_images_without_annotations, short
    ids = [i for i, img_id in enumerate(dataset.ids) if dataset.coco.getAnnIds(imgIds=img_id, iscrowd=None)]
    return torch.utils.data.Subset(dataset, ids)


def get_coco_api_from_dataset(dataset):  # references/detection/coco_utils.py
    for _ in range(10):
        if isinstance(dataset, torchvision.datasets.CocoDetection):
            break
        if isinstance(dataset, torch.utils.data.Subset):
            dataset = dataset.dataset
    if isinstance(dataset, torchvision.datasets.CocoDetection):
        return dataset.coco
    raise AssertionError(f"the references would convert {type(dataset).__name__} item by item: no .coco found")


def aspect_ratios_coco(dataset, indices):  # group_by_aspect_ratio._compute_aspect_ratios_coco_dataset
    return [dataset.coco.imgs[dataset.ids[i]]["width"] / dataset.coco.imgs[dataset.ids[i]]["height"] for i in indices]


def train_transforms():  # presets.DetectionPresetTrain(data_augmentation="hflip", backend="pil", use_v2=True)
    return v2.Compose(
        [
            v2.RandomHorizontalFlip(p=0.5),
            v2.PILToTensor(),
            v2.ToDtype(torch.float, scale=True),
            v2.ConvertBoundingBoxFormat("XYXY"),
            v2.SanitizeBoundingBoxes(),
            v2.ToPureTensor(),
        ]
    )


@pytest.fixture
def coco(tmp_path):
    img_folder = tmp_path / "coco" / "train2017"
    ann_file = make_coco(img_folder, 12, size=(96, 72), ann_file=tmp_path / "coco" / "annotations" / "t.json")
    with contextlib.redirect_stdout(io.StringIO()):
        theirs = torchvision.datasets.CocoDetection(str(img_folder), str(ann_file), transforms=train_transforms())
    # the page's lines, in get_coco's use_v2 branch
    dataset = cf.open_dataset(
        img_folder, layout="coco", labels=ann_file, output="tensor", mirrors=tmp_path / "mirrors", progress=False
    )
    dataset.transforms = train_transforms()
    ours = wrap_dataset_for_transforms_v2(dataset, target_keys=TARGET_KEYS)
    return remove_images_without_annotations(
        wrap_dataset_for_transforms_v2(theirs, target_keys=TARGET_KEYS)
    ), remove_images_without_annotations(ours)


def test_references_dataset_on_a_mirror_gives_coco_detection_items(coco):
    theirs, ours = coco
    assert ours.indices == theirs.indices and len(ours) > 4
    for i in range(len(ours)):
        torch.manual_seed(i)
        image_t, target_t = theirs[i]
        torch.manual_seed(i)
        image_o, target_o = ours[i]
        assert image_o.dtype == image_t.dtype == torch.float32
        torch.testing.assert_close(image_o, image_t, atol=0, rtol=0)
        assert target_o.keys() == target_t.keys() == set(TARGET_KEYS)
        for key in TARGET_KEYS:
            torch.testing.assert_close(torch.as_tensor(target_o[key]), torch.as_tensor(target_t[key]))
        assert len(target_o["boxes"]) > 0
    assert aspect_ratios_coco(ours.dataset, ours.indices) == aspect_ratios_coco(theirs.dataset, theirs.indices)


def test_references_loader_and_evaluation_through_dot_coco(coco):
    theirs, ours = coco
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ours), 2, drop_last=True)
    loader = cf.DataLoader(ours, batch_sampler=sampler, collate_fn=collate_fn)
    seen = [int(t["image_id"]) for _, targets in loader for t in targets]
    expected = sorted(ours.dataset.ids[i] for i in ours.indices)
    assert len(set(seen)) == len(seen) == 2 * (len(ours) // 2) and set(seen) <= set(expected)

    coco_gt = get_coco_api_from_dataset(loader.dataset)  # evaluate() in references/detection/engine.py
    truth = get_coco_api_from_dataset(theirs)
    assert sorted(coco_gt.imgs) == sorted(truth.imgs)
    assert coco_gt.anns == truth.anns

    # detections equal to the ground truth score AP 1.0; one box shifted by half its width scores less
    def ap(shift: float) -> float:
        results = []
        for k, ann in enumerate(coco_gt.anns.values()):
            x, y, w, h = ann["bbox"]
            results.append(
                {
                    "image_id": ann["image_id"],
                    "category_id": ann["category_id"],
                    "score": 1.0,
                    "bbox": [x + (shift * w if k == 0 else 0), y, w, h],
                }
            )
        with contextlib.redirect_stdout(io.StringIO()):
            evaluator = COCOeval(coco_gt, coco_gt.loadRes(results), "bbox")
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        return float(evaluator.stats[0])

    assert ap(0.0) == pytest.approx(1.0)
    assert ap(0.5) < 1.0


def test_references_model_trains_a_step_from_the_loader(coco):
    _, ours = coco
    loader = cf.DataLoader(ours, batch_size=2, shuffle=True, collate_fn=collate_fn)
    images, targets = next(iter(loader))
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=max(c["id"] for c in ours.dataset.categories) + 1
    )
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = model(list(images), list(targets))  # engine.train_one_epoch
    loss = sum(losses.values())
    assert {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"} <= set(losses)
    assert math.isfinite(float(loss.detach())) and float(loss.detach()) > 0
    optimizer.zero_grad()
    loss.backward()
    before = [p.detach().clone() for p in model.parameters() if p.grad is not None]
    optimizer.step()
    after = [p.detach() for p in model.parameters() if p.grad is not None]
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
