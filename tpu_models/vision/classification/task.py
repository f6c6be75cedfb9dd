"""Image classification: softmax cross-entropy, top-1/top-5, every eval image counted.

Inputs may be ImageNet-convention TFRecords (`image/encoded`,
`image/class/label`), decoded images from memory or TFDS (`{"image", "label"}`),
or synthetic data for throughput runs. Three augmentations:

    inception_crop   random-resized crop (area 0.08-1, aspect 3/4-4/3) + flip;
                     eval: center crop 0.875. The ImageNet recipe.
    randaugment      inception_crop, then RandAugment (`randaugment_num_ops`
                     operations of `randaugment_magnitude`, vision/image/augment.py)
                     on each training image; eval as inception_crop. The
                     EfficientNet and big_vision ViT recipes.
    pad_crop_flip    pad by `pad` pixels and crop back, + flip; eval: as is.
                     For 28-32 px images (Fashion-MNIST, CIFAR).
"""

import dataclasses
import inspect
from typing import Annotated, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import SIZE, DataConfig, ModelConfig, TaskConfig
from tpu_models.vision.classification import example as example_lib
from tpu_models.vision import image as image_lib
from tpu_models.data import pipeline
from tpu_models.data import skipping
from tpu_models.errors import ConfigError, DataError
from tpu_models.registry import DATASETS, model_signature, register_task
from tpu_models.task import (HIGHER, Agreement, Deployable, DeployFunction, Servable, Task,
                             weighted_mean)


@dataclasses.dataclass
class ClassificationConfig(TaskConfig):
  name: str = "classification"
  model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig("resnet50"))
  train_data: DataConfig = dataclasses.field(default_factory=DataConfig)
  eval_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(split="validation", shuffle_buffer=0))
  # Evaluated once after training (`tpu-models train`), never for model selection.
  test_data: Optional[DataConfig] = None
  image_size: Annotated[int, SIZE] = 224
  channels: Annotated[int, SIZE] = 3  # 1 or 3; a 1-channel source (Fashion-MNIST) is repeated to 3 for RGB.
  augment: str = "inception_crop"  # inception_crop | randaugment | pad_crop_flip | none
  # augment randaugment: N operations per training image, of magnitude M (0-30; 10 = the
  # paper's strongest; vision/image/augment.py:randaugment). Defaults: the paper's ImageNet N 2, M 9.
  randaugment_num_ops: int = 2
  randaugment_magnitude: float = 9.0
  crop_area_range: List[float] = dataclasses.field(default_factory=lambda: [0.08, 1.0])
  eval_crop_fraction: float = 0.875
  pad: int = 4  # pad_crop_flip
  flip: bool = True
  mean: List[float] = dataclasses.field(default_factory=lambda: list(image_lib.IMAGENET_MEAN_RGB))
  std: List[float] = dataclasses.field(default_factory=lambda: list(image_lib.IMAGENET_STD_RGB))
  label_smoothing: float = 0.0
  label_offset: int = 0  # Added to stored labels (ImageNet TFRecords from tensorflow/tpu: -1).
  host_bfloat16: bool = False  # Cast images to bfloat16 on the host: half the infeed bytes.
  mixup_alpha: float = 0.0  # > 0: mixup of each training batch (labels become soft).
  # A subset of the label set (transfer experiments): only examples whose stored label
  # (after label_offset) is listed are read, in every split, and label classes[i] becomes
  # i; task.model.num_classes must be len(classes). Empty = every label as stored.
  classes: List[int] = dataclasses.field(default_factory=list)
  # Training split only: the first N examples of each class in the source's order (before
  # shuffling; per input pipeline), a fixed labelled subset. None = all of them.
  train_examples_per_class: Optional[int] = None
  # Serving: larger images (height x width, from the header) are refused, not decoded; 0 = any.
  max_image_pixels: int = image_lib.DEFAULT_MAX_IMAGE_PIXELS
  # [height, width] of the pixels a LiteRT/ONNX export's serve_images takes (fixed shapes);
  # the evaluation transform (e.g. the center crop) to image_size runs inside. [] = [image_size,
  # image_size].
  export_image_shape: List[int] = dataclasses.field(default_factory=list)


_AUGMENTATIONS = ("inception_crop", "randaugment", "pad_crop_flip", "none")
_INCEPTION_CROPS = ("inception_crop", "randaugment")  # Augmentations that crop as inception_crop.


@register_task("classification")
class ClassificationTask(Task, Servable, Deployable):
  """Softmax classification over `num_classes` (taken from the model config)."""

  config_class = ClassificationConfig

  def __init__(self, config: ClassificationConfig):
    super().__init__(config)
    if config.augment not in _AUGMENTATIONS:
      raise ConfigError(f"task.augment must be one of {', '.join(_AUGMENTATIONS)}, "
                       f"got {config.augment!r}.")
    image_lib.check_randaugment(config.randaugment_num_ops, config.randaugment_magnitude)
    if len(config.mean) != config.channels or len(config.std) != config.channels:
      raise ConfigError(f"task.mean and task.std need {config.channels} values (task.channels), "
                       f"got {len(config.mean)} and {len(config.std)}.")
    self.num_classes = _num_classes(config.model)
    _check_class_subset(config, self.num_classes)
    self.export_image_shape = image_lib.export_image_shape(config.export_image_shape,
                                                           config.image_size)

  # Inputs.

  def build_inputs(self, split: str,
                   input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    training = split == "train"
    data = self.data_config(split)
    if data.source == "synthetic":
      return self._synthetic(data, training, input_context)
    mixup = self._mixup if training and self.config.mixup_alpha > 0 else None
    return pipeline.build_dataset(data, lambda e: self.decode(e, training),
                                  training=training, input_context=input_context,
                                  dataset=self._class_subset(split, data, input_context),
                                  validate=self._check_label, post_batch=mixup)

  def _class_subset(self, split: str, data: DataConfig,
                    input_context: Optional[tf.distribute.InputContext]
                    ) -> Optional[tf.data.Dataset]:
    """The source's undecoded elements of `task.classes` (and the per-class cap); None = all."""
    cfg = self.config
    per_class = cfg.train_examples_per_class if split == "train" else None
    if not cfg.classes and per_class is None:
      return None
    dataset = DATASETS.get(data.source)(data, split == "train", input_context)
    stored = self._stored_label
    if cfg.classes:
      wanted = tf.constant(cfg.classes, tf.int32)
      dataset = dataset.filter(lambda e: tf.reduce_any(tf.equal(stored(e), wanted)))
    if per_class is not None:
      classes = max(cfg.classes) + 1 if cfg.classes else self.num_classes

      def count(seen, element):
        # Labels outside [0, classes) are passed on, for _check_label to refuse.
        label = stored(element)
        inside = (label >= 0) & (label < classes)
        slot = tf.clip_by_value(label, 0, classes - 1)
        keep = tf.logical_not(inside) | (seen[slot] < per_class)
        seen = tf.tensor_scatter_nd_add(seen, [[slot]], [tf.cast(inside, tf.int64)])
        return seen, (element, keep)

      dataset = skipping.keep_flagged(dataset.scan(tf.zeros([classes], tf.int64), count))
    return dataset

  def _stored_label(self, element) -> tf.Tensor:
    """int32 [] label of one undecoded element, after task.label_offset."""
    if isinstance(element, tf.Tensor) and element.dtype == tf.string:
      element = example_lib.parse_image_example(element)
    return tf.cast(element["label"], tf.int32) + self.config.label_offset

  def synthetic_inputs(self, split: str,
                       input_context: Optional[tf.distribute.InputContext] = None
                       ) -> tf.data.Dataset:
    """Generated images of the configured size: no data needed (ImageNet-sized checks)."""
    return self._synthetic(self.data_config(split), split == "train", input_context)

  def _mixup(self, images, labels):
    """Batch-level mixup on the host; labels become float32 [batch, num_classes]."""
    one_hot = tf.one_hot(labels, self.num_classes)
    mixed, soft = image_lib.mixup(tf.cast(images, tf.float32), one_hot, self.config.mixup_alpha)
    return tf.cast(mixed, images.dtype), soft

  def decode(self, element, training: bool):
    """One raw element -> (image float32/bfloat16 [size, size, C], label int32 []).

    The label is not range-checked here: `_check_label` runs after the reader's
    `on_corrupt=skip` stage, so a label out of range is never skipped as corrupt.
    """
    cfg = self.config
    if isinstance(element, tf.Tensor) and element.dtype == tf.string:
      element = example_lib.parse_image_example(element)
    label = self._label(element)
    if "image/encoded" in element:
      image = self._from_bytes(element["image/encoded"], training)
    else:
      image = self._from_pixels(element["image"], training)
    image = image_lib.normalize(image, cfg.mean, cfg.std)
    image = tf.ensure_shape(image, [cfg.image_size, cfg.image_size, cfg.channels])
    if cfg.host_bfloat16:
      image = tf.cast(image, tf.bfloat16)
    return image, label

  def _label(self, element) -> tf.Tensor:
    """int32 [] label of a parsed element: after task.label_offset and task.classes."""
    cfg = self.config
    label = tf.cast(element["label"], tf.int32) + cfg.label_offset
    if cfg.classes:  # Stored label classes[i] -> i (the others were filtered out).
      index = {c: i for i, c in enumerate(cfg.classes)}
      table = tf.constant([index.get(c, -1) for c in range(max(cfg.classes) + 1)], tf.int32)
      label = tf.gather(table, tf.clip_by_value(label, 0, max(cfg.classes)))
    return label

  def _check_label(self, image: tf.Tensor, label: tf.Tensor):
    """A label outside [0, num_classes) is a config error (num_classes, label_offset), always."""
    in_range = tf.logical_and(label >= 0, label < self.num_classes)
    check = pipeline.assert_allowed(
        in_range, f"label out of range: expected 0 <= label < num_classes = {self.num_classes} "
                  f"(task.model.num_classes, after task.label_offset = "
                  f"{self.config.label_offset}); got", label)
    with tf.control_dependencies([check]):
      return image, tf.identity(label)

  # Fine-tuning.

  def variable_groups(self) -> Dict[str, str]:
    """`trainer.fine_tune` names: the classifier ("head", the `logits` layer) and the rest."""
    return {"backbone": "^(?!logits/)", "head": "^logits/"}

  def label_dependent_variables(self) -> str:
    """The `logits` layer ([features, num_classes]): rebuilt for another num_classes."""
    return "^logits/"

  def eval_metric_names(self) -> List[str]:
    return ["loss", "top1"] + (["top5"] if self.num_classes > 5 else []) + ["examples"]

  def metric_directions(self):
    directions = dict(super().metric_directions(), top1=HIGHER)
    if self.num_classes > 5:
      directions["top5"] = HIGHER
    return directions

  def _from_bytes(self, image_bytes, training: bool):
    cfg = self.config
    if cfg.augment in _INCEPTION_CROPS and training:
      image = image_lib.decode_and_random_crop(
          image_bytes, cfg.image_size, channels=cfg.channels,
          area_range=tuple(cfg.crop_area_range))
    elif cfg.augment in _INCEPTION_CROPS:
      image = image_lib.decode_and_center_crop(image_bytes, cfg.image_size, channels=cfg.channels,
                                               crop_fraction=cfg.eval_crop_fraction)
    else:
      image = tf.io.decode_image(image_bytes, channels=cfg.channels, expand_animations=False)
      return self._from_pixels(image, training)
    return self._flip_and_randaugment(image, training)

  def _flip_and_randaugment(self, image, training: bool):
    """The training image's random flip (task.flip) and RandAugment (augment randaugment)."""
    cfg = self.config
    if training and cfg.flip:
      image = image_lib.random_flip(image)
    if training and cfg.augment == "randaugment":
      image = image_lib.randaugment(image, cfg.randaugment_num_ops, cfg.randaugment_magnitude)
    return image

  def _from_pixels(self, image, training: bool):
    cfg = self.config
    if image.shape.rank == 3 and image.shape[-1] == 1 and cfg.channels == 3:
      # A grayscale source (Fashion-MNIST) for an RGB model: e.g. a classifier whose
      # weights initialise a detector's backbone.
      image = tf.image.grayscale_to_rgb(image)
    image.set_shape([None, None, cfg.channels])
    if cfg.augment in _INCEPTION_CROPS:
      if training:
        image = image_lib.random_resized_crop(image, cfg.image_size,
                                              area_range=tuple(cfg.crop_area_range))
      else:
        image = image_lib.center_crop(image, cfg.image_size, crop_fraction=cfg.eval_crop_fraction)
    else:
      image = tf.cast(image, tf.float32)
      if image.shape[0] != cfg.image_size or image.shape[1] != cfg.image_size:
        image = tf.image.resize(image, [cfg.image_size, cfg.image_size])
      if training and cfg.augment == "pad_crop_flip":
        image = image_lib.pad_and_random_crop(image, cfg.pad)
    return self._flip_and_randaugment(image, training)

  def _synthetic(self, data: DataConfig, training: bool, input_context):
    cfg = self.config
    batch = pipeline.per_replica_batch_size(data, input_context)
    dtype = tf.bfloat16 if cfg.host_bfloat16 else tf.float32
    image = tf.random.stateless_normal([cfg.image_size, cfg.image_size, cfg.channels], [1, 2],
                                       dtype=tf.float32)
    label = tf.constant(1 % self.num_classes, tf.int32)
    element = (tf.cast(image, dtype), label) if training else (tf.cast(image, dtype), label,
                                                               tf.constant(1.0))
    dataset = pipeline.synthetic_dataset(element, batch)
    if not training:  # A fixed-size eval set, then padding (mask 0) as usual.
      count = max(1, (data.num_examples or batch) // batch)
      pad = tf.nest.map_structure(tf.zeros_like, next(iter(dataset)))
      dataset = dataset.take(count).concatenate(tf.data.Dataset.from_tensors(pad).repeat())
    return dataset

  # Serving.

  def serving_signatures(self, model: keras.Model):
    """Encoded bytes and uint8 pixels in; logits, probabilities, classes and valid out.

        serving_default(image_bytes: tf.string [N])   encoded JPEG/PNG/GIF/BMP/WebP
        serve_images(images: uint8 [N, H, W, C])       decoded pixels, H = W = image_size

    both returning {"logits": float32 [N, K], "probabilities": float32 [N, K],
    "classes": int32 [N], "valid": bool [N], "reason": tf.string [N]};
    decoding, resizing and normalisation run inside the graph. One image that
    cannot be decoded, or whose header says it has more than
    `task.max_image_pixels` pixels (it is then never decoded), does not fail
    its batch: its row has `valid` False, the reason, logits and probabilities
    0 and class -1 (`reason` is "" for valid rows). An empty batch, or pixels of the wrong rank, channel count or
    size, is an InvalidArgumentError saying what was expected (a wrong dtype is
    refused by the signature). See docs/predict.md.
    """
    cfg = self.config
    image_lib.check_max_image_pixels(cfg.max_image_pixels)  # A one-line error, not a trace.
    image_spec = tf.TensorSpec([cfg.image_size, cfg.image_size, cfg.channels], tf.float32)
    blank = tf.zeros(image_spec.shape, tf.float32)

    def predict(images, valid, reason):
      logits = tf.cast(model(images, training=False), tf.float32)
      logits = tf.where(valid[:, None], logits, 0.0)
      return {"logits": logits,
              "probabilities": tf.where(valid[:, None], tf.nn.softmax(logits), 0.0),
              "classes": tf.where(valid, tf.argmax(logits, axis=-1, output_type=tf.int32), -1),
              "valid": valid, "reason": reason}

    def from_bytes(image_bytes):
      image = self._from_bytes(image_bytes, training=False)
      return image_lib.normalize(image, cfg.mean, cfg.std)

    def from_pixels(image):
      return image_lib.normalize(self._from_pixels(image, training=False), cfg.mean, cfg.std)

    # autograph=False here and below: plain TensorFlow ops, nothing for AutoGraph to rewrite;
    # converting the whole pre- and post-processing again at each export and trace cost CPU.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
                 autograph=False)
    def serving_default(image_bytes):
      with tf.control_dependencies([image_lib.assert_not_empty(image_bytes, "serving_default")]):
        images, valid, reason = tf.map_fn(
            lambda b: image_lib.decode_checked(b, from_bytes, blank, cfg.max_image_pixels),
            image_bytes, fn_output_signature=(image_spec, tf.TensorSpec([], tf.bool),
                                              tf.TensorSpec([], tf.string)))
      return predict(images, valid, reason)

    # The signature takes any shape: a SavedModel's signature does not check the shape
    # it declares, and a declared (static) rank would let TensorFlow drop the checks below.
    @tf.function(input_signature=[tf.TensorSpec(None, tf.uint8, name="images")], autograph=False)
    def serve_images(images):
      expected = f"serve_images: images must be uint8 [N, H, W, {cfg.channels}]"
      rank = tf.debugging.assert_equal(tf.rank(images), 4,
                                       message=f"{expected}; got another rank")
      with tf.control_dependencies([rank]):
        shape = tf.shape(images)
        checks = [
            image_lib.assert_not_empty(images, "serve_images"),
            tf.debugging.assert_equal(shape[3], cfg.channels,
                                      message=f"{expected}; got another number of channels "
                                              f"(task.channels is {cfg.channels})"),
            tf.debugging.assert_positive(shape[1:3],
                                         message=f"{expected} with height and width >= 1"),
        ]
      with tf.control_dependencies(checks):
        images = tf.identity(images)
      valid = tf.ones([tf.shape(images)[0]], tf.bool)
      return predict(tf.map_fn(from_pixels, images, fn_output_signature=image_spec), valid,
                     tf.fill(tf.shape(valid), ""))

    return {"serving_default": serving_default.get_concrete_function(),
            "serve_images": serve_images.get_concrete_function()}

  # Deployment (LiteRT, ONNX: tpu_models/export/).

  def deploy_functions(self, model: keras.Model) -> Dict[str, DeployFunction]:
    """`serve_images`: the SavedModel's `serve_images` at one fixed input shape.

        serve_images(images: uint8 [N, H, W, C])  ->  {"logits": float32 [N, K],
            "probabilities": float32 [N, K], "classes": int32 [N]}

    H, W = task.export_image_shape (default image_size x image_size). Inside the graph,
    as in the SavedModel: the evaluation transform of `task.augment` (inception_crop,
    randaugment: the center crop of eval_crop_fraction, resized to image_size; none,
    pad_crop_flip: resized to image_size when H, W differ), normalisation, the network.
    So the same pixels give the same classes in every format. Without `valid` and
    `reason` (pixels of the right shape are always valid). Decoding encoded images is
    the caller's: no builtin LiteRT op decodes JPEG/PNG, and ONNX has none.
    """
    cfg = self.config
    height, width = self.export_image_shape
    transform = self._eval_transform_text()

    @tf.function(input_signature=[tf.TensorSpec([None, height, width, cfg.channels], tf.float32,
                                                name="images")], autograph=False)
    def serve_images(images):
      images = self._eval_transform_batch(images)
      logits = tf.cast(model(image_lib.normalize(images, cfg.mean, cfg.std), training=False),
                       tf.float32)
      return {"logits": logits, "probabilities": tf.nn.softmax(logits),
              "classes": tf.argmax(logits, axis=-1, output_type=tf.int32)}

    return {"serve_images": DeployFunction(
        function=serve_images.get_concrete_function(),
        inputs={"images": f"pixels [N, {height}, {width}, {cfg.channels}], 0..255 (the "
                          f"SavedModel's serve_images input; inside: {transform})"},
        outputs={"logits": f"float32 [N, {self.num_classes}]",
                 "probabilities": f"float32 [N, {self.num_classes}] (softmax)",
                 "classes": "int32 [N] (argmax)"},
        outside_graph=(
            "decoding encoded images (JPEG/PNG/...): no builtin LiteRT or ONNX op decodes "
            "them; decode and pass uint8 pixels (the SavedModel's serving_default takes bytes)",
            f"pixels of another size: resize them to {height}x{width} (task.export_image_shape)"
            f" first; the SavedModel's serve_images takes any size",
            "valid/reason outputs: pixels of the right shape are always valid; a wrong shape "
            "or dtype is the runtime's error"),
        integer_inputs=("images",))}

  def _eval_transform_batch(self, images: tf.Tensor) -> tf.Tensor:
    """`_from_pixels(training=False)` of a batch of a static shape, without a loop."""
    cfg = self.config
    if cfg.augment in _INCEPTION_CROPS:
      return image_lib.center_crop_batch(images, cfg.image_size,
                                         crop_fraction=cfg.eval_crop_fraction)
    return image_lib.resize_batch(images, cfg.image_size)

  def _eval_transform_text(self) -> str:
    cfg = self.config
    if cfg.augment in _INCEPTION_CROPS:
      return (f"task.augment {cfg.augment!r}'s evaluation center crop "
              f"({cfg.eval_crop_fraction} of the shorter side) resized to {cfg.image_size}")
    return f"resized to {cfg.image_size}x{cfg.image_size} (task.augment {cfg.augment!r})"

  def export_pixels(self, split: str) -> tf.data.Dataset:
    """`split`'s images as a fixed-shape export takes them, in evaluation batches.

    (pixels float32 [B, H, W, C] of whole values 0..255, labels int32 [B], mask [B]):
    each image decoded as stored, before the evaluation transform, and resized to
    task.export_image_shape only when its size differs (the caller's step), rounded.
    """
    cfg = self.config
    height, width = self.export_image_shape
    data = self.data_config(split)

    def decode(element):
      if isinstance(element, tf.Tensor) and element.dtype == tf.string:
        element = example_lib.parse_image_example(element)
      if "image/encoded" in element:
        image = tf.io.decode_image(element["image/encoded"], channels=cfg.channels,
                                   expand_animations=False)
      else:
        image = element["image"]
        if image.shape.rank == 3 and image.shape[-1] == 1 and cfg.channels == 3:
          image = tf.image.grayscale_to_rgb(image)
      image = tf.cast(tf.ensure_shape(image, [None, None, cfg.channels]), tf.float32)
      if image.shape[0] != height or image.shape[1] != width:
        image = tf.clip_by_value(tf.round(tf.image.resize(image, [height, width])), 0.0, 255.0)
      return tf.ensure_shape(image, [height, width, cfg.channels]), self._label(element)

    return pipeline.build_dataset(data, decode, training=False,
                                  dataset=self._class_subset(split, data, None),
                                  validate=self._check_label)

  def calibration_inputs(self, examples: int):
    """Training-pipeline images (its augmentation included) as pixels 0..255, one at a time,
    resized to task.export_image_shape when it is not image_size x image_size."""
    height, width = self.export_image_shape
    for pixels in image_lib.pixel_rows(self.build_inputs("train"), self.config.mean,
                                       self.config.std, examples):
      if pixels.shape[1:3] != (height, width):
        pixels = np.round(tf.image.resize(pixels, [height, width]).numpy()).clip(0, 255)
      yield {"serve_images": {"images": pixels}}

  def evaluate_deployed(self, run, split: str, *, say=None) -> Dict[str, float]:
    """top-1 (and top-5) of `split` through `run("serve_images", ...)`, by `metrics`.

    The split's images as the export takes them (`export_pixels`: decoded, before the
    evaluation transform, which the export applies), in evaluation batches; `say` gets
    a line every 10 batches.
    """
    totals, batches = {}, 0
    for images, labels, mask in pipeline.until_padding(self.export_pixels(split)):
      real = mask.numpy() > 0  # The padding rows are not run.
      pixels = images.numpy()[real].astype(np.uint8)
      logits = run("serve_images", {"images": pixels})["logits"]
      sums = self.metrics(tf.constant(labels.numpy()[real]), tf.constant(logits, tf.float32),
                          tf.ones([int(real.sum())]))
      sums["examples"] = (tf.constant(float(real.sum())), tf.constant(1.0))
      for name, (total, count) in sums.items():
        previous = totals.get(name, (0.0, 0.0))
        totals[name] = (previous[0] + float(total), previous[1] + float(count))
      batches += 1
      if say and batches % 10 == 0:
        say(f"{int(totals['examples'][0])} examples")
    examples = totals.pop("examples", (0.0, 0.0))[0]
    if not examples:
      raise DataError(f"task.{split}_data yielded no examples to evaluate.")
    result = {name: total / count for name, (total, count) in totals.items()}
    result["examples"] = examples
    return result

  # int8 against the SavedModel on the same pixels: the tiny test classifier, 21 images
  # (tests/vision/classification/test_classification_deploy.py), and docs/deploy.md.
  int8_agreement_floor = 0.9

  def deployed_agreement(self, reference, exported, examples: int,
                         split: str = "eval") -> Agreement:
    """Same `classes` from both on up to `examples` of `split`'s images (`export_pixels`)."""
    agreeing = total = 0
    for images, _, mask in pipeline.until_padding(self.export_pixels(split)):
      pixels = images.numpy()[mask.numpy() > 0][:examples - total].astype(np.uint8)
      if not len(pixels):
        break
      ours = exported("serve_images", {"images": pixels})["classes"]
      theirs = reference("serve_images", {"images": pixels})["classes"]
      agreeing += int(np.sum(np.asarray(ours) == np.asarray(theirs)))
      total += len(pixels)
      if total >= examples:
        break
    if not total:
      raise DataError(f"task.{split}_data yielded no images to compare the export on.")
    return Agreement(agreeing, total, f"classes of {split} images")

  # Loss and metrics.

  def loss(self, labels, outputs):
    """Cross-entropy per example; `labels` are int32 [B] or soft float32 [B, K] (mixup)."""
    logits = tf.cast(outputs, tf.float32)
    soft = labels.dtype.is_floating
    if self.config.label_smoothing or soft:
      targets = labels if soft else tf.one_hot(labels, self.num_classes)
      return keras.losses.categorical_crossentropy(
          targets, logits, from_logits=True, label_smoothing=self.config.label_smoothing)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

  def metrics(self, labels, outputs, weights):
    logits = tf.cast(outputs, tf.float32)
    if labels.dtype.is_floating:  # Mixed labels: score against the dominant class.
      labels = tf.argmax(labels, axis=-1, output_type=tf.int32)
    sums = {"top1": weighted_mean(tf.math.in_top_k(labels, logits, 1), weights)}
    if self.num_classes > 5:
      sums["top5"] = weighted_mean(tf.math.in_top_k(labels, logits, 5), weights)
    return sums


def _check_class_subset(config: ClassificationConfig, num_classes: int) -> None:
  """task.classes: distinct labels >= 0, as many as the model's classes; a positive cap."""
  classes = config.classes
  if classes:
    if len(set(classes)) != len(classes) or min(classes) < 0:
      raise ConfigError(f"task.classes must list distinct labels >= 0; got {classes}.")
    if len(classes) != num_classes:
      raise ConfigError(f"task.classes lists {len(classes)} labels but task.model.num_classes "
                        f"is {num_classes}; they must agree (label classes[i] becomes i).")
  per_class = config.train_examples_per_class
  if per_class is not None and per_class < 1:
    raise ConfigError(f"task.train_examples_per_class must be >= 1 (or unset); got {per_class}.")


def _num_classes(model: ModelConfig) -> int:
  if "num_classes" in model.params:
    return int(model.params["num_classes"])
  parameter = model_signature(model.name).parameters.get("num_classes")
  if parameter is None or parameter.default is inspect.Parameter.empty:
    raise ConfigError(f"task.model {model.name!r} has no num_classes argument; classification "
                     f"needs one.")
  return int(parameter.default)
