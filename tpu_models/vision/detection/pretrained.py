"""The detection family's importers and catalogue of public COCO RetinaNet / Mask R-CNN weights.

Facts from torchvision's `RetinaNet_ResNet50_FPN*_Weights` and
`MaskRCNN_ResNet50_FPN_Weights`, keras-hub's
RetinaNet presets (converted from torchvision's) and Model Garden's
MODEL_GARDEN.md; nothing is downloaded.
"""

from tpu_models.vision.detection import keras_hub  # (registers its importer)
from tpu_models.vision.detection import model_garden  # noqa: F401 (registers its importer)
from tpu_models.vision.detection import torchvision  # (registers its importer)
from tpu_models.vision.detection import torchvision_maskrcnn  # (registers its importer)
from tpu_models.weights.catalogue import (LabelSet, Preprocessing, RemoteFile, WeightsEntry,
                                          register_weights, torchvision_checkpoint)

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_COCO_NAMES_NEEDED = ("the COCO 2017 category names and ids: the 'categories' of any "
                      "instances_*.json annotation file (what `tpu-models convert coco` reads); "
                      "no copy is committed here")
COCO_91_TORCHVISION = LabelSet(
    "coco-2017 (91 columns)", 91, needed=_COCO_NAMES_NEEDED,
    convention="column = COCO category id (1..90, with ids 12, 26, 29, 30, 45, 66, 68, 69, 71, "
               "83 unused); column 0 '__background__' is an ordinary, never-trained sigmoid "
               "column, not a softmax background")
COCO_90_FROM_MODEL_GARDEN = LabelSet(
    "coco-2017 (90 classes)", 90, needed=_COCO_NAMES_NEEDED,
    convention="our class c = COCO category id c + 1: Model Garden's 91 outputs have "
               "background at 0, which the importer drops (--option drop_background=false keeps "
               "it: then num_classes 91 and class = category id)")
_TORCHVISION_PRE = Preprocessing(
    crop=800, resize=None, interpolation="bilinear", mean=_IMAGENET_MEAN, std=_IMAGENET_STD)
# The square model input of the imported detector. torchvision resizes the
# shorter side to 800 (longer <= 1333) and pads to 32 per image; our task
# resizes the longer side to image_size and pads to a square. 1024 keeps a
# typical 640x480 COCO image at 1024x768 (torchvision: 1067x800, 0.96 of our
# scale), and as a multiple of 128 it makes torchvision's own stride rule
# (padded size // feature size) give exactly 64 and 128 on P6 and P7.
TORCHVISION_IMAGE_SIZE = 1024


def _imagenet_input(image_size: int) -> dict:
  """Task keys of a detector fed `image_size` squares normalised by ImageNet's mean/std
  on 0-255 pixels (every catalogued detector's input)."""
  return {"image_size": image_size, "mean": [round(m * 255, 6) for m in _IMAGENET_MEAN],
          "std": [round(s * 255, 6) for s in _IMAGENET_STD]}


# torchvision's detectors' input: its transform's size here.
_TORCHVISION_INPUT = _imagenet_input(TORCHVISION_IMAGE_SIZE)
_TORCHVISION_TASK = {
    "name": "detection", **_TORCHVISION_INPUT,
    # torchvision's postprocess_detections: per level sigmoid > 0.05, top 1000,
    # boxes clipped to the unpadded image, class-wise NMS at 0.5, 300 kept.
    "pre_nms_top_k": 1000, "pre_nms_top_k_per_level": True, "clip_to_content": True,
    "score_threshold": 0.05, "nms_iou_threshold": 0.5, "max_detections": 300,
}

register_weights(WeightsEntry(
    name="torchvision_retinanet_resnet50_fpn_coco", family="retinanet",
    source_format="torchvision",
    **torchvision_checkpoint("retinanet_resnet50_fpn_coco-eeacb38b",
                             "torchvision RetinaNet_ResNet50_FPN_Weights.COCO_V1"),
    model="retinanet_resnet50_fpn",
    params={"num_classes": 91, "image_size": TORCHVISION_IMAGE_SIZE,
            **torchvision.TORCHVISION_RETINANET_V1},
    task=_TORCHVISION_TASK,
    accuracy={"box_ap": 36.4}, preprocessing=_TORCHVISION_PRE, labels=COCO_91_TORCHVISION,
    notes="torchvision resizes the shorter side to 800 (longer at most 1333) inside the model "
          "and pads each image to a multiple of 32; the imported model_dir resizes the longer "
          "side to 1024 and pads to 1024x1024 (our task's fixed input; P6/P7 strides exactly "
          "64/128 there), so its COCO AP is near, not equal to, the published 36.4 (not "
          "measured here). Raw outputs and detections equal torchvision's at torchvision's own "
          "padded sizes (benchmarks/torch/parity.py). Inputs RGB; the .pth needs torch to "
          "read (or convert it once to .safetensors where torch is installed)."))
register_weights(WeightsEntry(
    name="torchvision_retinanet_resnet50_fpn_v2_coco", family="retinanet",
    source_format="torchvision",
    **torchvision_checkpoint("retinanet_resnet50_fpn_v2_coco-5905b1c5",
                             "torchvision RetinaNet_ResNet50_FPN_V2_Weights.COCO_V1"),
    model="retinanet_resnet50_fpn", params={"num_classes": 91},
    accuracy={"box_ap": 41.5}, preprocessing=_TORCHVISION_PRE, labels=COCO_91_TORCHVISION,
    refused="v2's head normalises every subnet conv with GroupNorm (32 groups; its convs have "
            "no bias): our RetinaNet has per-level BatchNorm or no norm, so those weights have "
            "no place (it also takes P6 from C5, which p67_input: c5 could express)."))
COCO_90_FROM_TORCHVISION = LabelSet(
    "coco-2017 (90 classes)", 90, needed=_COCO_NAMES_NEEDED,
    convention="our class c = COCO category id c + 1 (ids 12, 26, 29, 30, 45, 66, 68, 69, 71, "
               "83 unused): torchvision's 91 softmax outputs have background at 0, which "
               "our box head keeps as its own background logit (its deltas and mask "
               "channel are dropped on import)")
register_weights(WeightsEntry(
    name="torchvision_maskrcnn_resnet50_fpn_coco", family="maskrcnn",
    source_format="torchvision",
    **torchvision_checkpoint("maskrcnn_resnet50_fpn_coco-bf2d0c1e",
                             "torchvision MaskRCNN_ResNet50_FPN_Weights.COCO_V1"),
    model="maskrcnn_resnet50_fpn",
    params={"num_classes": 90, "image_size": TORCHVISION_IMAGE_SIZE,
            **torchvision_maskrcnn.TORCHVISION_MASKRCNN_V1},
    task={"name": "maskrcnn", **_TORCHVISION_INPUT},
    accuracy={"box_ap": 37.9, "mask_ap": 34.6}, preprocessing=_TORCHVISION_PRE,
    labels=COCO_90_FROM_TORCHVISION,
    notes="torchvision resizes the shorter side to 800 (longer at most 1333) and pads to a "
          "multiple of 32; the imported model_dir resizes the longer side to 1024 and pads to "
          "1024x1024 (our task's fixed input), and clips boxes to that input rather than to "
          "the image inside the padding (give the model {'image', 'image_hw'} for "
          "torchvision's clipping), so its COCO APs are near, not equal to, the published "
          "37.9 box / 34.6 mask (not measured here). Our detections take the 1000 best "
          "(RoI, class) pairs into NMS; torchvision takes every pair above 0.05 (equal "
          "whenever at most 1000 pass). RPN outputs, proposals, box-head outputs, detections "
          "and masks equal torchvision's at its own padded sizes "
          "(benchmarks/torch/parity.py). Inputs RGB; the .pth needs torch to read."))
# keras-hub's preset at its 800x800 input; the importer's params (keras_hub.py).
KERAS_HUB_IMAGE_SIZE = 800
_KERAS_HUB_PRE = Preprocessing(crop=KERAS_HUB_IMAGE_SIZE, resize=None, interpolation="bilinear",
                               mean=_IMAGENET_MEAN, std=_IMAGENET_STD)
register_weights(WeightsEntry(
    name="keras_hub_retinanet_resnet50_fpn_coco", family="retinanet", source_format="keras_hub",
    download="kaggle://keras/retinanet/keras/retinanet_resnet50_fpn_coco/4 (keras-hub preset "
             "retinanet_resnet50_fpn_coco)",
    remote=RemoteFile(url="kaggle://keras/retinanet/keras/retinanet_resnet50_fpn_coco/4",
                      name="keras_retinanet_keras_retinanet_resnet50_fpn_coco_4",
                      published="none: Kaggle publishes no SHA-256 of a preset's files that is "
                                "reachable offline; fetched with --trust-unverified only (each "
                                "file's hash recorded on first use)"),
    files=("a preset directory: config.json + model.weights.h5 + task.json + "
           "task.weights.h5",), model="retinanet_resnet50_fpn",
    params={"num_classes": 91, "image_size": KERAS_HUB_IMAGE_SIZE,
            **keras_hub.KERAS_HUB_RETINANET},
    task={"name": "detection", **_imagenet_input(KERAS_HUB_IMAGE_SIZE),
          # keras-hub's NonMaxSuppression defaults: best class per anchor, sigmoid > 0.5,
          # one NMS over all classes at 0.5, 100 kept, boxes not clipped.
          "nms_class_agnostic": True, "clip_boxes": False, "pre_nms_top_k": 1000,
          "score_threshold": 0.5, "nms_iou_threshold": 0.5, "max_detections": 100},
    preprocessing=_KERAS_HUB_PRE, labels=COCO_91_TORCHVISION,
    notes="keras-hub's conversion of torchvision's COCO_V1 detector into its own RetinaNet: "
          "its ResNet-50 (PyTorch padding, BN epsilon 1e-5, not torchvision's frozen 0), P6/P7 "
          "convs padded like TensorFlow, torchvision's anchor rule, no norms. Raw outputs, "
          "anchors and detections equal keras-hub's own (benchmarks/keras_hub/parity.py). "
          "keras-hub's converter folds ImageNet mean/std into scale 1/255/std, offset "
          "-mean/std; our task resizes the longer side to 800 and pads. keras-hub's 0.5 "
          "threshold suits inference, not COCO AP (lower task.score_threshold for "
          "evaluation). Published box AP: not given by keras-hub."))

_MG_PRE = Preprocessing(crop=640, resize=None, interpolation="bilinear", mean=_IMAGENET_MEAN,
                        std=_IMAGENET_STD)
register_weights(WeightsEntry(
    name="model_garden_retinanet_resnet50_fpn_coco", family="retinanet",
    source_format="model_garden",
    download="Model Garden official/vision/MODEL_GARDEN.md, COCO object detection: RetinaNet "
             "ResNet-50 FPN 640x640, its 'ckpt' link (a TF2 checkpoint directory, archived)",
    remote=RemoteFile(
        url="https://storage.googleapis.com/tf_model_garden/vision/retinanet/"
            "retinanet-resnet50fpn.tar.gz",
        archive="tar.gz", published="none: MODEL_GARDEN.md links the archive without a hash "
                                    "or size; fetched with --trust-unverified only"),
    files=("a TF2 checkpoint directory: checkpoint + ckpt-N.index + ckpt-N.data-*",), model="retinanet_resnet50_fpn",
    params={"num_classes": 90, "image_size": 640, "bn_epsilon": 1e-3, "bn_momentum": 0.99},
    task={"name": "detection", **_imagenet_input(640),
          "pre_nms_top_k": 5000, "score_threshold": 0.05, "nms_iou_threshold": 0.5,
          "max_detections": 100},
    accuracy={"box_ap": 37.3},
    preprocessing=_MG_PRE, labels=COCO_90_FROM_MODEL_GARDEN,
    notes="Published box AP (official/vision/MODEL_GARDEN.md, RetinaNet ImageNet-pretrained, "
          "R50-FPN 640x640, COCO val2017): 37.3 for the 36-epoch schedule, 34.3 for 12 "
          "epochs; check which one the checkpoint you download is. Longer side resized to "
          "640 and padded, as our detection task does."))

# Model Garden's maskrcnn_resnetfpn_coco experiment (official/vision/configs/maskrcnn.py
# defaults: ResNet-50, FPN 256, P2-P6, 1024x1024, 91 classes with background at 0): what
# `tpu-models migrate model-garden` reads from a checkpoint of it.
_MG_MASKRCNN_R50 = {
    "num_classes": 91, "input_size": [1024, 1024, 3], "min_level": 2, "max_level": 6,
    "anchor": {"num_scales": 1, "aspect_ratios": [0.5, 1.0, 2.0], "anchor_size": 8.0},
    "include_mask": True, "outer_boxes_scale": 1.0,
    "backbone": {"type": "resnet", "resnet": {"model_id": 50, "depth_multiplier": 1.0,
                                              "stem_type": "v0", "se_ratio": 0.0,
                                              "stochastic_depth_drop_rate": 0.0,
                                              "scale_stem": True, "resnetd_shortcut": False,
                                              "replace_stem_max_pool": False,
                                              "bn_trainable": True}},
    "decoder": {"type": "fpn", "fpn": {"num_filters": 256}},
    "rpn_head": {"num_convs": 1, "num_filters": 256},
    "detection_head": {"num_convs": 4, "num_filters": 256, "num_fcs": 1, "fc_dims": 1024,
                       "class_agnostic_bbox_pred": False},
    "roi_generator": {"num_proposals": 1000, "test_pre_nms_top_k": 1000,
                      "test_nms_iou_threshold": 0.7, "test_num_proposals": 1000},
    "roi_sampler": {"num_sampled_rois": 512, "foreground_fraction": 0.25,
                    "foreground_iou_threshold": 0.5},
    "roi_aligner": {"crop_size": 7, "sample_offset": 0.5},
    "detection_generator": {"pre_nms_top_k": 5000, "pre_nms_score_threshold": 0.05,
                            "nms_iou_threshold": 0.5, "max_num_detections": 100,
                            "use_sigmoid_probability": False},
    "mask_head": {"upsample_factor": 2, "num_convs": 4, "num_filters": 256,
                  "class_agnostic": False},
    "mask_sampler": {"num_sampled_masks": 128},
    "mask_roi_aligner": {"crop_size": 14, "sample_offset": 0.5},
    "norm_activation": {"activation": "relu", "norm_momentum": 0.997, "norm_epsilon": 0.0001},
}
_MG_MASKRCNN_MODEL, _MG_MASKRCNN_PARAMS = model_garden.maskrcnn_model_params(_MG_MASKRCNN_R50)
register_weights(WeightsEntry(
    name="model_garden_maskrcnn_resnet50_fpn_coco", family="maskrcnn",
    source_format="model_garden",
    download="no checkpoint is published: Model Garden official/vision/MODEL_GARDEN.md lists "
             "Mask R-CNN ResNet50-FPN with its config only; a checkpoint of the "
             "maskrcnn_resnetfpn_coco experiment you trained (a TF2 checkpoint directory)",
    files=("a TF2 checkpoint directory: checkpoint + ckpt-N.index + ckpt-N.data-*",),
    model=_MG_MASKRCNN_MODEL, params=_MG_MASKRCNN_PARAMS,
    task={"name": "maskrcnn", "image_size": 1024,
          "mean": [round(m * 255, 6) for m in _IMAGENET_MEAN],
          "std": [round(s * 255, 6) for s in _IMAGENET_STD]},
    accuracy={"box_ap": 42.3, "mask_ap": 37.6},
    preprocessing=Preprocessing(crop=1024, resize=None, interpolation="bilinear",
                                mean=_IMAGENET_MEAN, std=_IMAGENET_STD),
    labels=COCO_90_FROM_MODEL_GARDEN,
    remote=RemoteFile(url="", published="nothing to hash: Model Garden publishes no Mask R-CNN "
                                        "R50-FPN checkpoint (config only)"),
    notes="Published COCO val2017 AP (MODEL_GARDEN.md, Mask R-CNN trained from scratch, "
          "ResNet50-FPN 640x640, 350 epochs, r50fpn_640_coco_scratch_tpu4x4.yaml): box 42.3, "
          "mask 37.6. That row's config uses P3-P7 and anchor size 3, which our Mask R-CNN "
          "does not express (P2 onwards); the entry's params are the maskrcnn_resnetfpn_coco "
          "experiment's defaults (P2-P6, 1024x1024, BN epsilon 1e-4), what `tpu-models "
          "migrate model-garden` maps; check your checkpoint's config. Background (class 0) "
          "dropped: our class c = COCO category id c + 1."))
