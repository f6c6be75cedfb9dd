"""Our model config for a Model Garden model config, and output comparisons for parity checks.

    name, params = model_params_from_model_garden("retinanet", mg_model_config)
    model = create_model(name, **params)
    load_model_garden_checkpoint(model, checkpoint, "retinanet")
    result = compare_outputs("retinanet", model, arrays)   # arrays: the worker's outputs.npz

`mg_model_config` is Model Garden's `task.model` config as a dict
(`params.task.model.as_dict()`; benchmarks/model_garden/migration_worker.py
writes it to model_garden.json).
"""

from typing import Any, Dict, Mapping, Tuple

import numpy as np

from tpu_models.errors import ConfigError

# Model Garden's ResNet-18/34 project the first shortcut of every stage (see resnet.py).
_BASIC_BLOCK_DEPTHS = (18, 34)


def model_params_from_model_garden(family: str, mg: Mapping[str, Any]) -> Tuple[str, Dict[str, Any]]:
  """(registered model name, builder kwargs) of our model equal to a Model Garden model.

  Args:
    family: "resnet", "retinanet" or "transformer".
    mg: Model Garden's `task.model` config as a dict (ImageClassificationModel,
      RetinaNet, or the translation ModelConfig plus "vocab_size").

  Returns:
    (model name, params) for `create_model` / the `task.model` of a config.
  """
  if family == "resnet":
    resnet = mg["backbone"]["resnet"]
    _check_resnet(resnet)
    depth = int(resnet["model_id"])
    return "resnet", {
        "depth": depth, "num_classes": int(mg["num_classes"]),
        "input_shape": [int(s) for s in mg["input_size"]],
        "width": int(round(64 * float(resnet.get("depth_multiplier", 1.0)))),
        "bn_epsilon": float(mg["norm_activation"]["norm_epsilon"]),
        "bn_momentum": float(mg["norm_activation"]["norm_momentum"]),
        "project_first_shortcut": depth in _BASIC_BLOCK_DEPTHS,
        "dropout_rate": float(mg.get("dropout_rate", 0.0)),
    }
  if family == "retinanet":
    resnet = mg["backbone"]["resnet"]
    _check_resnet(resnet)
    depth = int(resnet["model_id"])
    height, width = int(mg["input_size"][0]), int(mg["input_size"][1])
    return "retinanet", {
        "backbone_depth": depth,
        "num_classes": int(mg["num_classes"]) - 1,  # Model Garden's class 0 is background.
        "image_size": height if height == width else [height, width],
        "min_level": int(mg["min_level"]), "max_level": int(mg["max_level"]),
        "num_scales": int(mg["anchor"]["num_scales"]),
        "aspect_ratios": [float(r) for r in mg["anchor"]["aspect_ratios"]],
        "anchor_size": float(mg["anchor"]["anchor_size"]),
        "fpn_channels": int(mg["decoder"]["fpn"]["num_filters"]),
        "head_channels": int(mg["head"]["num_filters"]),
        "head_convs": int(mg["head"]["num_convs"]),
        "bn_epsilon": float(mg["norm_activation"]["norm_epsilon"]),
        "bn_momentum": float(mg["norm_activation"]["norm_momentum"]),
        "backbone_width": int(round(64 * float(resnet.get("depth_multiplier", 1.0)))),
        "backbone_project_first_shortcut": depth in _BASIC_BLOCK_DEPTHS,
    }
  if family == "transformer":
    encoder, decoder = mg["encoder"], mg["decoder"]
    for key in ("num_attention_heads", "intermediate_size", "activation", "norm_first"):
      if encoder[key] != decoder[key]:
        raise ConfigError(f"Model Garden encoder and decoder differ in {key} ({encoder[key]} vs "
                          f"{decoder[key]}); our Transformer uses one value for both.")
    if encoder.get("use_bias") or abs(float(encoder.get("norm_epsilon", 1e-6)) - 1e-6) > 1e-12:
      raise ConfigError("Only Model Garden's translation defaults use_bias=False and "
                        "norm_epsilon=1e-6 map onto our Transformer.")
    if not encoder["norm_first"]:
      # Model Garden's post-LN stacks still end with a LayerNorm; ours (the paper's) do not.
      raise ConfigError("Model Garden's Transformer with norm_first=False (post-LN plus a final "
                        "LayerNorm per stack) has no equivalent here; norm_first=True maps "
                        "onto our pre_layer_norm=True.")
    return "transformer", {
        "vocab_size": int(mg["vocab_size"]),
        "num_encoder_layers": int(encoder["num_layers"]),
        "num_decoder_layers": int(decoder["num_layers"]),
        "hidden_size": int(mg["embedding_width"]),
        "num_heads": int(encoder["num_attention_heads"]),
        "filter_size": int(encoder["intermediate_size"]),
        "activation": encoder["activation"],
        "pre_layer_norm": bool(encoder["norm_first"]),
        "share_embeddings": True,
    }
  raise ConfigError(f"Unknown Model Garden family {family!r}; expected resnet, retinanet or "
                    f"transformer.")


def _check_resnet(resnet: Mapping[str, Any]) -> None:
  """Model Garden ResNet options our ResNet does not have (exact parity impossible)."""
  unsupported = {
      "stem_type": ("v0",), "se_ratio": (0.0, None), "resnetd_shortcut": (False,),
      "replace_stem_max_pool": (False,),
  }
  for key, allowed in unsupported.items():
    if key in resnet and resnet[key] not in allowed:
      raise ConfigError(f"Model Garden ResNet option {key}={resnet[key]!r} has no equivalent in "
                        f"tpu_models' ResNet (supported: {allowed[0]!r}).")


def _detections(arrays: Mapping[str, np.ndarray], image: int, prefix: str,
                class_offset: int = 0) -> np.ndarray:
  """[n, 6] rows (score, class, ymin, xmin, ymax, xmax) of one image, sorted (ties broken by box)."""
  n = int(arrays[f"{prefix}num_detections"][image])
  rows = np.concatenate([
      arrays[f"{prefix}scores"][image, :n, None].astype(np.float64),
      arrays[f"{prefix}classes"][image, :n, None].astype(np.float64) + class_offset,
      arrays[f"{prefix}boxes"][image, :n].astype(np.float64)], axis=1)
  keys = [np.round(rows[:, c], 3) for c in range(5, 1, -1)] + [rows[:, 1], -np.round(rows[:, 0], 5)]
  return rows[np.lexsort(keys)]


def compare_outputs(family: str, model, arrays: Mapping[str, np.ndarray],
                    params: Mapping[str, Any]) -> Dict[str, Any]:
  """Runs our (loaded) model on the Model Garden worker's inputs and compares.

  Args:
    family: "resnet", "retinanet" or "transformer".
    model: our model with the Model Garden weights loaded.
    arrays: the worker's outputs.npz (inputs and Model Garden's outputs).
    params: our model's builder kwargs (RetinaNet: the anchor layout).

  Returns a dict:
    resnet:      max_abs_diff (logits), max_abs (their logits' scale).
    retinanet:   max_abs_diff_class_l{l}, max_abs_diff_box_l{l} per level,
                 max_abs_diff_anchors, detections_equal (count, classes, scores
                 within 1e-5 and boxes within 1e-3 px per image, ties in
                 score in any order), num_detections.
    transformer: max_abs_diff (teacher-forced logits), beam_ids_equal,
                 max_abs_diff_beam_scores.
  """
  import tensorflow as tf
  result: Dict[str, Any] = {}
  if family == "resnet":
    logits = model(arrays["images"], training=False).numpy()
    result["max_abs_diff"] = float(np.abs(logits - arrays["logits"]).max())
    result["max_abs"] = float(np.abs(arrays["logits"]).max())
    return result
  if family == "retinanet":
    from tpu_models.vision.detection import anchors as anchor_ops
    from tpu_models.vision.detection import nms
    outputs = model(arrays["images"], training=False)
    class_logits = outputs["class_logits"].numpy()
    box_deltas = outputs["box_deltas"].numpy()
    levels = sorted(int(k[len("cls_l"):]) for k in arrays if k.startswith("cls_l"))
    per_location = arrays[f"box_l{levels[0]}"].shape[-1] // 4
    start, worst = 0, 0.0
    for level in levels:
      their_class, their_box = arrays[f"cls_l{level}"], arrays[f"box_l{level}"]
      batch, h, w, _ = their_class.shape
      n = h * w * per_location
      their_class = their_class.reshape(batch, n, -1)[..., 1:]  # Without background 0.
      d_class = float(np.abs(class_logits[:, start:start + n] - their_class).max())
      d_box = float(np.abs(box_deltas[:, start:start + n] -
                           their_box.reshape(batch, n, 4)).max())
      result[f"max_abs_diff_class_l{level}"] = d_class
      result[f"max_abs_diff_box_l{level}"] = d_box
      worst = max(worst, d_class, d_box)
      start += n
    result["max_abs_diff"] = worst
    their_anchors = np.concatenate([arrays[f"anchors_l{l}"].reshape(-1, 4) for l in levels])
    from tpu_models.vision.detection import retinanet
    image_size = arrays["images"].shape[1:3]
    ours_anchors = anchor_ops.multilevel_anchors(**retinanet.anchor_layout(**params)).numpy()
    result["max_abs_diff_anchors"] = float(np.abs(ours_anchors - their_anchors).max())
    # Model Garden's generator (NMS v2): scores of classes 1.., per-class top 5000,
    # threshold 0.05, IoU 0.5, 100 detections, boxes clipped to the image.
    detections = nms.postprocess(tf.constant(class_logits), tf.constant(box_deltas),
                                 ours_anchors, pre_nms_top_k=5000, score_threshold=0.05,
                                 iou_threshold=0.5, max_detections=100,
                                 image_size=tuple(int(s) for s in image_size))
    ours = {f"ours_{k}": v.numpy() for k, v in detections.items()}
    theirs = {"mg_" + k[len("detection_"):] if k.startswith("detection_") else "mg_" + k: arrays[k]
              for k in ("detection_boxes", "detection_scores", "detection_classes",
                        "num_detections")}
    equal = True
    for image in range(class_logits.shape[0]):
      a = _detections(ours, image, "ours_", class_offset=1)  # Our class c = MG class c + 1.
      b = _detections(theirs, image, "mg_")
      if a.shape != b.shape or not (np.array_equal(a[:, 1], b[:, 1]) and
                                    np.allclose(a[:, 0], b[:, 0], atol=1e-5) and
                                    np.allclose(a[:, 2:], b[:, 2:], atol=1e-3)):
        equal = False
    result["detections_equal"] = equal
    result["num_detections"] = [int(n) for n in arrays["num_detections"]]
    return result
  if family == "transformer":
    logits = model({"inputs": arrays["sources"], "targets": arrays["targets"]},
                   training=False).numpy()
    result["max_abs_diff"] = float(np.abs(logits - arrays["logits"]).max())
    their_ids = arrays["beam_ids"].copy()
    # Model Garden keeps EOS (1) in its output; ours ends at EOS (replaced by 0, like the rest).
    after_eos = np.cumsum(their_ids == 1, axis=1) > 0
    their_ids[after_eos] = 0
    decoded = model.translate(arrays["sources"], beam_size=int(arrays["beam_size"]),
                              alpha=float(arrays["alpha"]),
                              max_decode_length=their_ids.shape[1])
    result["beam_ids_equal"] = bool(np.array_equal(decoded["ids"].numpy(), their_ids))
    result["max_abs_diff_beam_scores"] = float(
        np.abs(decoded["scores"].numpy() - arrays["beam_scores"].reshape(-1)).max())
    return result
  raise ConfigError(f"Unknown Model Garden family {family!r}.")
