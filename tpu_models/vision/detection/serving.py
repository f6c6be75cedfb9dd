"""Serving, `predict` and deployment of the detection family's detectors, written once.

`DetectorServing` is a component of the detection task (`task.DetectionTask`), which
forwards its Servable, FilePredictor and Deployable methods here: the SavedModel's
`serving_default` (encoded bytes) and `serve_images` (pixels), `tpu-models
predict`'s pictures, and the LiteRT/ONNX `serve_images` with its evaluation and
agreement check. Every path is

    pixels -> resize longer side to S, pad bottom/right, normalise (`_resize_pixels`)
           -> outputs = model(images)                      (the same call for every detector)
           -> detector.detections(outputs, infos)          (padded detections in
                                                            model-input pixels)
           -> boxes mapped to the input image's pixels
           -> detector.instance_outputs(detections, ...)   (extra per-detection outputs
                                                            over an image, e.g. masks)

with the task's detector component (`detector.Detector`), which also gives the
words `export.json` records for its extra outputs (`instance_output_docs`), D
(`max_detections`) and its deployment limits (`deploy_overrides`). From the task
it reads `config`, `image_size`, `display_names()`, `build_inputs(split)`,
`aggregate` and `finalize`.

Instance masks: a detection dict may hold "masks", float32 [B, D, m, m]
probabilities over each box; `predict` then draws them (`draw.draw_masks`) and
writes them to the JSON as COCO RLE, and the agreement check compares them (mask
IoU) when both outputs carry "detection_masks".
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tpu_models.data import pipeline
from tpu_models.errors import DataError
from tpu_models.task import Agreement, DeployFunction
from tpu_models.vision import image as image_lib
from tpu_models.vision.detection import inputs as detection_data
from tpu_models.vision.detection import masks as mask_ops

POSTPROCESS_SCOPE = "postprocess"  # deploy_functions' float32 part of an int8 export.
# The agreement check: matched detections overlap by box IoU >= this, and their masks too.
SAME_IOU = 0.9

_DETECTION_KEYS = ("detection_boxes", "detection_scores", "detection_classes",
                   "num_detections")


class DetectorServing:
  """The serving, predict and deployment part of the detection task (module docstring).

  A component of `task.DetectionTask`, which forwards its Servable, FilePredictor and
  Deployable methods here; it reads the task's config, image size, names, inputs and
  evaluation, and its detector's `detections` and `instance_outputs`.
  """

  def __init__(self, task):
    self.task = task
    self.config = task.config
    self.image_size = task.image_size
    self.detector = task.detector

  # Pictures of `tpu-models predict`.

  def _detect_pixels_fn(self, model: keras.Model):
    """uint8 [H, W, 3] -> {"boxes" [D, 4] in its pixels, "scores" [D], "classes" [D],
    "num_detections" [], + "masks" [D, m, m] over each box for a segmenter}.

    The masks stay box-relative: `predict` pastes each over the image on the host when it
    needs it (`_HostPastedMasks`). Pasting all D in the graph took D image-sized float32
    planes: 5.1 GB for the 8 detections of a legal 8000x8000 PNG (issue 48).
    """

    @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)], autograph=False)
    def detect(pixels):
      image, info = self._resize_pixels(pixels)
      found = self._model_detections(model, image[None], info[None])
      result = {"boxes": detection_data.to_original_pixels(found["boxes"], info[None]),
                "scores": found["scores"], "classes": found["classes"],
                "num_detections": found["num_detections"]}
      if "masks" in found:
        result["masks"] = found["masks"]
      return {key: value[0] for key, value in result.items()}

    return detect

  def _model_detections(self, model, images, infos):
    return self.detector.detections(_float32(model(images, training=False)), infos)

  def predict_files(self, model: keras.Model, paths, output_dir: str, *,
                    options: Optional[Mapping[str, Any]] = None, say=None) -> List[str]:
    """Detects objects in JPEG/PNG files; writes each drawn at its size to output_dir/<name>.png.

    A segmenter's instance masks are drawn under the boxes (`draw.draw_masks`), and
    output_dir/<name>.json holds what the picture cannot give back: the image's size and
    its detections at or above the drawn score, {"label", "name", "score", "box" [ymin,
    xmin, ymax, xmax] in the image's pixels, "mask" (COCO compressed RLE of the
    image-sized mask)}. A detector without masks writes the picture only.

    Args:
      model: the trained detector (float32).
      paths: image files (any tf.io.gfile path).
      output_dir: where the pictures go (created).
      options: `predict`'s options from this family's CLI (vision/detection/cli.py):
        "min_score", the lowest score drawn and printed (None or absent:
        eval_image_min_score).
      say: receives one line per image: "<path>: N detections: name 0.91 [ymin, xmin,
        ymax, xmax], ... -> <png>", or "<path>: error: ..." for a file that cannot be
        read or decoded (skipped; the others are still processed).

    Returns:
      The paths that failed.
    """
    from tpu_models.vision.detection import draw

    say = say or print
    min_score = (options or {}).get("min_score")
    min_score = self.config.eval_image_min_score if min_score is None else float(min_score)
    names = self.task.display_names()
    detect = self._detect_pixels_fn(model)
    failed, used = [], set()
    max_pixels = image_lib.check_max_image_pixels(self.config.max_image_pixels)
    for path in paths:
      try:
        with tf.io.gfile.GFile(path, "rb") as f:
          data = f.read()
        # The serving path's header check: a decompression bomb is never decoded.
        refused = image_lib.check_image_header(tf.constant(data), max_pixels).numpy().decode()
        if refused:
          say(f"{path}: error: not decoded: {refused}; skipped (task.max_image_pixels "
              f"{max_pixels}; 0 = no limit).")
          failed.append(path)
          continue
        pixels = tf.io.decode_image(data, channels=3, expand_animations=False)
      except (tf.errors.OpError, OSError) as e:
        reason = e.message if isinstance(e, tf.errors.OpError) else str(e)
        say(f"{path}: error: not a readable JPEG/PNG image "
            f"({pipeline.error_summary(reason).splitlines()[0][:200]}); skipped.")
        failed.append(path)
        continue
      found = {key: value.numpy() for key, value in detect(pixels).items()}
      count = int(found["num_detections"])
      boxes, scores, classes = (found[key][:count] for key in ("boxes", "scores", "classes"))
      picture = pixels.numpy()
      masks = None
      if "masks" in found:
        masks = _HostPastedMasks(found["masks"][:count], boxes, *picture.shape[:2],
                                 threshold=self.config.mask_threshold)
        picture = draw.draw_masks(picture, masks, classes, scores, min_score=min_score)
      picture = draw.draw_detections(picture, boxes, classes, scores, names,
                                     min_score=min_score)
      stem = os.path.splitext(os.path.basename(path))[0] or "image"
      name, n = stem, 1
      while name in used:  # Two inputs with one basename (a/x.jpg, b/x.jpg).
        n += 1
        name = f"{stem}-{n}"
      used.add(name)
      out = draw.write_png(os.path.join(output_dir, f"{name}.png"), picture)
      if masks is not None:  # What the picture cannot give back: the masks, as JSON.
        _write_detections_json(os.path.join(output_dir, f"{name}.json"), path,
                               pixels.shape[:2], boxes, classes, scores, masks, names,
                               min_score)
      lines = draw.detection_lines(boxes, classes, scores, names, min_score)
      say(f"{path}: {len(lines)} detection{'s' if len(lines) != 1 else ''}"
          f"{': ' + '; '.join(lines) if lines else ''} -> {out}")
    return failed

  # The SavedModel.

  def serving_signatures(self, model: keras.Model):
    """Encoded bytes or uint8 pixels in; detections in the input image's pixels out.

        serving_default(image_bytes: tf.string [B])   encoded JPEG/PNG/GIF/BMP/WebP
        serve_images(images: uint8 [B, H, W, 3])       decoded pixels, any H, W

    Both return {"detection_boxes": float32 [B, D, 4] [ymin, xmin, ymax, xmax]
    in pixels of each input image, "detection_scores": float32 [B, D],
    "detection_classes": int32 [B, D] labels 0..K-1 (-1 past the count; the
    label map gives names and category ids), "num_detections": int32 [B],
    "valid": bool [B], "reason": tf.string [B]}, plus the detector's
    `instance_outputs` (serve_images: over the input's H x W; serving_default,
    whose images differ in size: over the model-input frame). Resizing,
    normalisation and NMS run inside the graph.

    As in classification, an image that cannot be decoded, or whose header
    says it has more than `task.max_image_pixels` pixels, does not fail its
    batch: its row has `valid` False, the reason ("" for valid rows) and no
    detections (count 0, boxes, scores and extra outputs 0, classes -1). An
    empty batch, or pixels of the wrong rank or channel count, is an
    InvalidArgumentError saying what was expected. See docs/predict.md.
    """
    cfg = self.config
    image_lib.check_max_image_pixels(cfg.max_image_pixels)  # A one-line error, not a trace.
    size = self.image_size
    specs = (tf.TensorSpec([size, size, 3], tf.float32), tf.TensorSpec([4, 2], tf.float32))
    blank = (tf.zeros([size, size, 3], tf.float32), tf.zeros([4, 2], tf.float32))

    def from_bytes(image_bytes):
      image, _, _, info = detection_data.resize_and_pad(
          image_bytes, tf.zeros([0, 4]), size, mean=cfg.mean, std=cfg.std,
          method=cfg.resize_method)
      return image, info

    def detect(images, infos, valid, reason, image_shape):
      found = self._model_detections(model, images, infos)
      boxes = detection_data.to_original_pixels(found["boxes"], infos)
      outputs = {
          "detection_boxes": tf.where(valid[:, None, None], boxes, 0.0),
          "detection_scores": tf.where(valid[:, None], found["scores"], 0.0),
          "detection_classes": tf.where(valid[:, None], found["classes"], -1),
          "num_detections": tf.where(valid, found["num_detections"], 0),
          "valid": valid,
          "reason": reason,
      }
      for key, value in self.detector.instance_outputs(found, infos, image_shape).items():
        rows = tf.reshape(valid, [-1] + [1] * (value.shape.rank - 1))
        outputs[key] = tf.where(rows, value, tf.zeros_like(value))
      return outputs

    # autograph=False here and below: plain TensorFlow ops, nothing for AutoGraph to rewrite;
    # converting the whole pre- and post-processing again at each export and trace cost CPU.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
                 autograph=False)
    def serving_default(image_bytes):
      with tf.control_dependencies([image_lib.assert_not_empty(image_bytes, "serving_default")]):
        (images, infos), valid, reason = tf.map_fn(
            lambda b: image_lib.decode_checked(b, from_bytes, blank, cfg.max_image_pixels),
            image_bytes, fn_output_signature=(specs, tf.TensorSpec([], tf.bool),
                                              tf.TensorSpec([], tf.string)))
      return detect(images, infos, valid, reason, None)

    # Any shape in the signature: a declared rank would let TensorFlow drop the checks
    # (a SavedModel signature does not enforce the shape it declares).
    @tf.function(input_signature=[tf.TensorSpec(None, tf.uint8, name="images")], autograph=False)
    def serve_images(images):
      expected = "serve_images: images must be uint8 [N, H, W, 3]"
      rank = tf.debugging.assert_equal(tf.rank(images), 4, message=f"{expected}; got another rank")
      with tf.control_dependencies([rank]):
        shape = tf.shape(images)
        checks = [
            image_lib.assert_not_empty(images, "serve_images"),
            tf.debugging.assert_equal(shape[3], 3,
                                      message=f"{expected}; got another number of channels"),
            tf.debugging.assert_positive(shape[1:3],
                                         message=f"{expected} with height and width >= 1"),
        ]
      with tf.control_dependencies(checks):
        images = tf.ensure_shape(tf.identity(images), [None, None, None, 3])
      pixels_shape = (tf.shape(images)[1], tf.shape(images)[2])
      images, infos = tf.map_fn(self._resize_pixels, images, fn_output_signature=specs)
      valid = tf.ones([tf.shape(images)[0]], tf.bool)
      return detect(images, infos, valid, tf.fill(tf.shape(valid), ""), pixels_shape)

    return {"serving_default": serving_default.get_concrete_function(),
            "serve_images": serve_images.get_concrete_function()}

  def serving_outputs(self) -> Dict[str, Any]:
    """What the SavedModel's signatures return, for its export.json (`outputs`)."""
    d = self.detector.max_detections
    common = {"detection_boxes": f"float32 [B, {d}, 4] [ymin, xmin, ymax, xmax] in pixels "
                                 f"of each input image",
              "detection_scores": f"float32 [B, {d}]",
              "detection_classes": f"int32 [B, {d}] labels 0..K-1, -1 past the count",
              "num_detections": "int32 [B]",
              "valid": "bool [B]: false for an image that could not be decoded",
              "reason": "string [B]: why not valid, '' for valid rows"}
    return {"serving_default": dict(common, **self.detector.instance_output_docs(d)),
            "serve_images": dict(common, **self.detector.instance_output_docs(d, ("H", "W")))}

  # Deployment (LiteRT, ONNX: tpu_models/export/).

  def _export_shape(self) -> Tuple[int, int]:
    return image_lib.export_image_shape(self.config.export_image_shape, self.image_size)

  def deploy_functions(self, model: keras.Model) -> Dict[str, DeployFunction]:
    """`serve_images`: the SavedModel's `serve_images` at one fixed input shape.

        serve_images(images: uint8 [B, H, W, 3])  ->  {"detection_boxes": float32
            [B, D, 4] [ymin, xmin, ymax, xmax] in the input's pixels,
            "detection_scores": float32 [B, D], "detection_classes": int32 [B, D]
            (-1 past the count), "num_detections": int32 [B], + the detector's
            `instance_outputs` over H x W}

    H, W = task.export_image_shape (default S x S, the model's input). Inside, as the
    SavedModel does it (`_resize_pixels`): the longer side resized to S, padding at the
    bottom/right, normalisation, the network, the detector's post-processing (RetinaNet:
    box decoding and the project's fixed-shape per-class NMS, nms.py: top-k, matrix IoU,
    a while loop: builtin LiteRT ops), boxes mapped back to the input's pixels. An int8
    export quantizes the network and keeps what follows it (the `postprocess` name
    scope: `float_scopes`) float32. Outside: decoding encoded images.
    """
    cfg = self.config
    size = self.image_size
    height, width = self._export_shape()
    # The geometry `_resize_pixels` computes in the graph, here in Python (float32 alike).
    original = np.array([height, width], np.float32)
    resized_hw = np.maximum(np.round(original * np.float32(size / original.max())), 1.0)
    content = np.minimum(resized_hw, size).astype(int)
    info = np.stack([original, content.astype(np.float32), resized_hw / original,
                     np.zeros([2], np.float32)]).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, height, width, 3], tf.float32,
                                                name="images")], autograph=False)
    def serve_images(images):
      if (int(resized_hw[0]), int(resized_hw[1])) != (height, width):
        images = tf.image.resize(images, [int(resized_hw[0]), int(resized_hw[1])],
                                 method=cfg.resize_method)
      images = image_lib.normalize(images[:, :size, :size, :], cfg.mean, cfg.std)
      images = tf.pad(images, [[0, 0], [0, size - content[0]], [0, size - content[1]], [0, 0]])
      outputs = model(images, training=False)
      with tf.name_scope(POSTPROCESS_SCOPE):  # Stays float32 in an int8 export.
        infos = tf.tile(tf.constant(info)[None], [tf.shape(images)[0], 1, 1])
        found = self.detector.detections(_float32(outputs), infos)
        boxes = detection_data.to_original_pixels(found["boxes"], infos)
        extra = self.detector.instance_outputs(found, infos, (height, width))
      return {"detection_boxes": boxes,
              "detection_scores": found["scores"],
              "detection_classes": found["classes"],
              "num_detections": found["num_detections"],
              **extra}

    d = self.detector.max_detections
    inside = ("" if (height, width) == (size, size) else
              f"resized to {int(resized_hw[0])}x{int(resized_hw[1])} and padded to "
              f"{size}x{size} inside")
    function = DeployFunction(
        function=serve_images.get_concrete_function(),
        inputs={"images": f"pixels [B, {height}, {width}, 3], 0..255 (the SavedModel's "
                          f"serve_images input{'; ' + inside if inside else ''})"},
        outputs={"detection_boxes": f"float32 [B, {d}, 4] [ymin, xmin, ymax, xmax] in the "
                                    f"{height}x{width} input's pixels",
                 "detection_scores": f"float32 [B, {d}]",
                 "detection_classes": f"int32 [B, {d}] labels 0..K-1, -1 past the count",
                 "num_detections": "int32 [B]",
                 **self.detector.instance_output_docs(d, (height, width))},
        outside_graph=(
            "decoding encoded images (JPEG/PNG/...): no builtin LiteRT or ONNX op decodes "
            "them; decode and pass uint8 pixels (the SavedModel's serving_default takes bytes)",
            f"pixels of another size: resize them to {height}x{width} "
            f"(task.export_image_shape) first and scale the boxes back; the SavedModel's "
            f"serve_images takes any size",
            "valid/reason outputs: pixels of the right shape are always valid; a wrong shape "
            "or dtype is the runtime's error"),
        integer_inputs=("images",),
        # Measured on the pasted-objects detector: with the NMS quantized too, LiteRT's
        # int8 DIV (the IoU's union) stops on a divisor at its zero point.
        float_scopes={POSTPROCESS_SCOPE: (
            "box decoding and the fixed-shape NMS stay float32: boxes in pixels need more "
            "than 256 levels, and LiteRT's int8 DIV (the IoU's union) refuses a divisor at "
            "its zero point; the network (normalisation, backbone, FPN, heads) is int8")})
    # The detector's limits (Mask R-CNN: float32 only).
    return {"serve_images": dataclasses.replace(function, **self.detector.deploy_overrides())}

  def _export_batches(self, split: str):
    """(uint8 pixels [n, H, W, 3] as serve_images takes them, their labels, the factor
    [n, 1, 4] that maps boxes in those pixels to the evaluation's S x S input), per
    evaluation batch without its padding rows.

    At the default export shape these are the evaluation pipeline's own images; at
    another, each image's content (the padding cut off) resized to it.
    """
    cfg = self.config
    height, width = self._export_shape()
    for images, labels, mask in pipeline.until_padding(self.task.build_inputs(split)):
      real = mask.numpy() > 0
      pixels = image_lib.denormalize_to_pixels(tf.cast(images, tf.float32).numpy()[real],
                                               cfg.mean, cfg.std)
      labels = {key: value.numpy()[real] for key, value in labels.items()}
      factor = np.ones([len(pixels), 1, 4], np.float32)
      if (height, width) != (self.image_size, self.image_size):
        content = labels["image_info"][:, detection_data.INFO_CONTENT_SIZE].astype(int)
        pixels = np.stack([
            np.clip(np.round(tf.image.resize(image[:h, :w], [height, width]).numpy()), 0, 255)
            for image, (h, w) in zip(pixels, content)]).astype(np.uint8)
        factor = np.tile(content[:, None] / np.array([height, width], np.float32), 2)
      yield pixels, labels, factor.astype(np.float32)

  def calibration_inputs(self, examples: int):
    """Training-pipeline images (augmented, resized, padded) as pixels 0..255, one at a time,
    resized to task.export_image_shape when it is not the model's S x S."""
    height, width = self._export_shape()
    for pixels in image_lib.pixel_rows(self.task.build_inputs("train"), self.config.mean,
                                       self.config.std, examples):
      if pixels.shape[1:3] != (height, width):
        pixels = np.round(tf.image.resize(pixels, [height, width]).numpy()).clip(0, 255)
      yield {"serve_images": {"images": pixels}}

  def deployed_host_outputs(self, detections: Mapping[str, np.ndarray],
                            labels: Mapping[str, np.ndarray], factor: np.ndarray
                            ) -> Dict[str, np.ndarray]:
    """What `aggregate` reads of one batch scored through an export (`evaluate_deployed`).

    Args:
      detections: the export's serve_images outputs (numpy).
      labels: the evaluation pipeline's labels of those images.
      factor: float32 [n, 1, 4], export input pixels -> the evaluation's S x S input.

    Returns:
      The host outputs of `eval_step` that `aggregate` reads: ids, geometry, ground
      truth and detections in the evaluation's input pixels, and the detector's own
      (`Detector.deployed_host_outputs`: a segmenter's masks).
    """
    host = {key: labels[source] for key, source in (
        ("source_id", "source_id"), ("image_info", "image_info"), ("gt_boxes", "boxes"),
        ("gt_classes", "classes"), ("gt_is_crowd", "is_crowd"),
        ("num_instances", "num_instances"))}
    host.update({key: np.asarray(detections[key]) for key in (
        "detection_scores", "detection_classes", "num_detections")})
    host["detection_boxes"] = np.asarray(detections["detection_boxes"]) * factor
    host.update(self.detector.deployed_host_outputs(detections, labels, factor))
    return host

  def evaluate_deployed(self, run, split: str, *, say=None) -> Dict[str, float]:
    """The evaluation's COCO AP of `split` (`aggregate`, `finalize`) through `run`.

    At an export shape other than S x S the images are resampled twice (the
    evaluation's resize, then to the export's shape): close to, not exactly, the
    evaluation's AP.
    """
    state, batches = None, 0
    for pixels, labels, factor in self._export_batches(split):
      detections = run("serve_images", {"images": pixels})
      state = self.task.aggregate(state, self.deployed_host_outputs(detections, labels, factor),
                             split=split)
      batches += 1
      if say and batches % 10 == 0:
        say(f"{batches} batches")
    if state is None:
      raise DataError(f"task.{split}_data yielded no examples to evaluate.")
    return self.task.finalize(state, split=split)

  def deployed_agreement(self, reference, exported, examples: int,
                         split: str = "eval") -> Agreement:
    """Images whose detections (score >= eval_image_min_score) are the same in both.

    The same: one-to-one, same class, box IoU >= 0.9 and, when both outputs have
    "detection_masks", mask IoU >= 0.9; a detection within 0.01 of the score threshold
    may be missing from the other (a rounding, not another answer).
    """
    agreeing = total = 0
    with_masks = False
    for pixels, _, _ in self._export_batches(split):
      pixels = pixels[:examples - total]
      ours = exported("serve_images", {"images": pixels})
      theirs = reference("serve_images", {"images": pixels})
      with_masks = "detection_masks" in ours and "detection_masks" in theirs
      for i in range(len(pixels)):
        agreeing += same_detections(ours, theirs, i, self.config.eval_image_min_score)
      total += len(pixels)
      if total >= examples:
        break
    if not total:
      raise DataError(f"task.{split}_data yielded no images to compare the export on.")
    return Agreement(agreeing, total, f"images' detections{' and masks' if with_masks else ''} "
                                      f"of {split}")

  def _resize_pixels(self, image: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """uint8 [H, W, 3] -> (image [S, S, 3], image_info [4, 2]) as evaluation resizes bytes.

    The whole image, longer side to S, padded at the bottom/right: the same
    geometry and image_info as `inputs.resize_and_pad` with its defaults.
    """
    cfg = self.config
    size = self.image_size
    original = tf.cast(tf.shape(image)[:2], tf.float32)
    resized_hw = tf.maximum(tf.round(original * (size / tf.reduce_max(original))), 1.0)
    resized = tf.image.resize(image, tf.cast(resized_hw, tf.int32), method=cfg.resize_method)
    resized = resized[:size, :size, :]
    content = tf.shape(resized)[:2]
    resized = image_lib.normalize(resized, cfg.mean, cfg.std)
    padded = tf.pad(resized, [[0, size - content[0]], [0, size - content[1]], [0, 0]])
    padded.set_shape([size, size, 3])
    info = tf.stack([original, tf.cast(content, tf.float32), resized_hw / original,
                     tf.zeros([2], tf.float32)])
    return padded, info


def _float32(outputs: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """The model's floating outputs as float32 (a bfloat16 policy's too); integers as they are."""
  return {key: tf.cast(value, tf.float32) if value.dtype.is_floating else value
          for key, value in outputs.items()}


def same_detections(a, b, i: int, min_score: float, margin: float = 0.01) -> bool:
  """Whether row `i` of two serve_images outputs holds the same detections (see
  `DetectorServing.deployed_agreement`)."""
  with_masks = "detection_masks" in a and "detection_masks" in b

  def rows(out, threshold):
    n = int(out["num_detections"][i])
    keep = np.asarray(out["detection_scores"][i, :n]) >= threshold
    masks = np.asarray(out["detection_masks"][i, :n])[keep] if with_masks else None
    return (np.asarray(out["detection_boxes"][i, :n])[keep],
            np.asarray(out["detection_classes"][i, :n])[keep], masks)

  for one, other in ((a, b), (b, a)):
    sure_boxes, sure_classes, sure_masks = rows(one, min_score + margin)
    boxes, classes, masks = rows(other, min_score - margin)
    used = np.zeros(len(boxes), bool)
    for k, (box, label) in enumerate(zip(sure_boxes, sure_classes)):
      overlap = np.where((classes == label) & ~used, _iou(box, boxes), 0.0)
      best = int(np.argmax(overlap)) if len(overlap) else -1
      if best < 0 or overlap[best] < SAME_IOU:
        return False
      if with_masks and mask_ops.mask_iou(sure_masks[k], masks[best]) < SAME_IOU:
        return False
      used[best] = True
  return True


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
  """IoU of one [ymin, xmin, ymax, xmax] box with each of `boxes` [n, 4]."""
  top_left = np.maximum(box[:2], boxes[:, :2])
  bottom_right = np.minimum(box[2:], boxes[:, 2:])
  inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
  area = lambda b: np.prod(np.clip(b[..., 2:] - b[..., :2], 0, None), axis=-1)
  return inter / np.maximum(area(box) + area(boxes) - inter, 1e-9)


class _HostPastedMasks:
  """The image-sized binary masks of `predict`'s detections, each pasted when it is read
  (`masks[i]`: uint8 [H, W]) with the host's `masks.paste_masks`, which gives the
  graph's values and visits only the box's pixels: one image-sized plane at a time."""

  def __init__(self, masks: np.ndarray, boxes: np.ndarray, height: int, width: int,
               threshold: float):
    self._masks, self._boxes = masks, boxes
    self._height, self._width, self._threshold = int(height), int(width), float(threshold)

  def __len__(self) -> int:
    return len(self._masks)

  def __getitem__(self, i: int) -> np.ndarray:
    return mask_ops.paste_masks(self._masks[i:i + 1], self._boxes[i:i + 1], self._height,
                                self._width, threshold=self._threshold)[0]


def _write_detections_json(path: str, image_path: str, image_hw, boxes, classes, scores,
                           masks, names, min_score: float) -> str:
  """`predict`'s JSON of one image: its size and the detections at or above `min_score`,
  best first, each with its mask as COCO RLE when there are masks."""
  from tpu_models.vision.detection import draw

  detections = []
  for i in np.argsort(-np.asarray(scores), kind="stable"):
    if classes[i] < 0 or scores[i] < min_score:
      continue
    entry = {"label": int(classes[i]), "name": draw.label_text(int(classes[i]), names),
             "score": round(float(scores[i]), 4),
             "box": [round(float(v), 2) for v in boxes[i]]}
    if masks is not None:
      entry["mask"] = mask_ops.mask_to_rle(masks[i])
    detections.append(entry)
  record = {"image": image_path, "height": int(image_hw[0]), "width": int(image_hw[1]),
            "box_format": "[ymin, xmin, ymax, xmax] in the image's pixels",
            "min_score": min_score, "detections": detections}
  if masks is not None:
    record["mask_format"] = ("COCO compressed RLE of the image-sized binary mask "
                             "(pycocotools.mask.decode)")
  with tf.io.gfile.GFile(path, "w") as f:
    json.dump(record, f, indent=1)
  return path
