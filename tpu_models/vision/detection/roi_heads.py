"""Mask R-CNN's second stage: RoI sampling, the box head, the mask head and their losses.

    rois, class_targets, box_targets, valid, is_positive, mask_targets = sample_rois(
        proposals, proposal_valid, gt_boxes, gt_classes, gt_masks, settings)
    head = box_head(7, 256, 1024, num_classes)   # [R, 7, 7, C] -> logits [R, K + 1], deltas [R, 4K]
    masks = mask_head(14, 256, 4, 256, num_classes)  # [[R, 14, 14, C], classes [R]] -> [R, 28, 28]
    losses = roi_losses(training_outputs, huber_delta=1.0)  # {name: float32 [B]}

Sampling: proposals and ground-truth boxes matched by IoU, `num_sampled_rois` of
them drawn with at most `roi_positive_fraction` positives (`roi_ops.sample_fixed`),
positives first; their class targets (0 background), class-specific box targets
(coder weights `ROI_BOX_WEIGHTS`) and the mask targets of the first positive slots.
The box head is box_head_convs 3x3 convs and box_head_fcs fully connected layers;
the mask head mask_head_convs 3x3 convs, a 2x2 stride-2 transposed conv (a matmul:
`layers.TiledConv2DTranspose`) and a 1x1 conv evaluated only for each RoI's own class
(`ClassMaskLogits`). Variables: box_head/{conv{i},fc{i},class_logits,box_deltas}/...,
mask_head/{conv{i},upsample,mask_logits}/....
"""

from typing import Dict

import keras
import tensorflow as tf

from tpu_models.vision.detection import boxes as box_ops
from tpu_models.vision.detection import losses as detection_losses
from tpu_models.vision.detection import roi_ops
from tpu_models.vision.detection.rpn import per_image
from tpu_models.vision.layers import EigenConv2D, TiledConv2DTranspose

# Faster R-CNN's second-stage box coder (Detectron, Model Garden, torchvision).
ROI_BOX_WEIGHTS = (10.0, 10.0, 5.0, 5.0)
MASK_SIZE_FACTOR = 2  # The mask head upsamples its RoI features 2x: 14 -> 28.


def _compute_dtype() -> str:
  """The heads' input dtype: the policy's compute dtype, which RoIAlign's crops already have
  (a float32 Input would cast them to float32 and the first layer back, both ways)."""
  return keras.mixed_precision.global_policy().compute_dtype


def box_head(roi_size: int, channels: int, fc_dims: int, num_classes: int,
              num_convs: int = 0, num_fcs: int = 2, batch_norm=None) -> keras.Model:
  """[R, s, s, C] RoI features -> (class logits [R, K + 1], class-specific deltas [R, 4K]).

  num_convs 3x3 convs of C channels, then num_fcs fully connected layers of
  fc_dims, each followed by ReLU; with batch_norm (a BN layer factory), by BN
  and then ReLU (Model Garden's DetectionHead).
  """
  with keras.name_scope("box_head"):
    features = keras.Input((roi_size, roi_size, channels), dtype=_compute_dtype(),
                           name="roi_features")
    x = features
    activation = None if batch_norm else "relu"
    for i in range(num_convs):
      x = EigenConv2D(channels, 3, padding="same", activation=activation, name=f"conv{i}",
                      kernel_initializer=keras.initializers.VarianceScaling(2.0))(x)
      if batch_norm:
        x = keras.layers.ReLU(name=f"conv{i}_relu")(batch_norm(f"conv{i}_bn")(x))
    x = keras.layers.Flatten(name="flatten")(x)
    for i in range(1, num_fcs + 1):
      x = keras.layers.Dense(fc_dims, activation=activation, name=f"fc{i}")(x)
      if batch_norm:
        x = keras.layers.ReLU(name=f"fc{i}_relu")(batch_norm(f"fc{i}_bn")(x))
    logits = keras.layers.Dense(num_classes + 1, name="class_logits", dtype="float32",
                                kernel_initializer=keras.initializers.RandomNormal(stddev=0.01))(x)
    deltas = keras.layers.Dense(4 * num_classes, name="box_deltas", dtype="float32",
                                kernel_initializer=keras.initializers.RandomNormal(
                                    stddev=0.001))(x)
  return keras.Model(features, [logits, deltas], name="box_head")


@keras.saving.register_keras_serializable(package="tpu_models")
class ClassMaskLogits(keras.layers.Layer):
  """The mask head's last 1x1 conv, evaluated for one class per RoI.

  Variables as a `keras.layers.Conv2D(num_masks, 1)`'s (kernel [1, 1, C,
  num_masks], bias [num_masks]), so checkpoints and weight imports see that
  layer. Only the class each RoI is trained on (or detected as) is ever read,
  so only its column is computed: [H*W, C] @ [C] per RoI (a batched matmul),
  not all num_masks maps and a selection: at 80 classes 1/80 of the product,
  and the gradient reaches the same kernel columns. It computes in its compute
  dtype (bfloat16 under mixed_bfloat16, as the convs before it) and returns
  float32 logits for the sigmoid loss.

  Call: [features [R, H, W, C], classes int [R] (0..num_masks-1; clipped, so
  -1 padding reads class 0)] -> float32 logits [R, H, W].
  """

  def __init__(self, num_masks: int, kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.num_masks = int(num_masks)
    self.kernel_initializer = keras.initializers.get(kernel_initializer)

  def build(self, input_shape):
    channels = input_shape[0][-1]
    self.kernel = self.add_weight(name="kernel", shape=(1, 1, channels, self.num_masks),
                                  initializer=self.kernel_initializer)
    self.bias = self.add_weight(name="bias", shape=(self.num_masks,), initializer="zeros")

  def call(self, inputs):
    features, classes = inputs
    classes = tf.clip_by_value(tf.cast(classes, tf.int32), 0, self.num_masks - 1)
    features = tf.cast(features, self.compute_dtype)
    height, width, channels = features.shape[1], features.shape[2], features.shape[3]
    columns = tf.gather(tf.transpose(tf.convert_to_tensor(self.kernel)[0, 0]), classes)  # [R, C]
    logits = tf.matmul(tf.reshape(features, [-1, height * width, channels]), columns[:, :, None])
    logits = tf.reshape(logits, [-1, height, width])
    logits += tf.gather(tf.convert_to_tensor(self.bias), classes)[:, None, None]
    return tf.cast(logits, tf.float32)

  def compute_output_shape(self, input_shape):
    return tuple(input_shape[0][:3])

  def get_config(self):
    return {**super().get_config(), "num_masks": self.num_masks,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}


def mask_head(roi_size: int, channels: int, num_convs: int, head_channels: int,
               mask_classes: int, batch_norm=None) -> keras.Model:
  """[RoI features [R, s, s, C], classes int32 [R]] -> mask logits [R, 2s, 2s] (float32).

  The logits of each RoI's own class (0..mask_classes-1; class-agnostic: one).
  With batch_norm (a BN layer factory), every conv and the upsampling are
  followed by BN, then ReLU (Model Garden's MaskHead).
  """
  activation = None if batch_norm else "relu"

  def normalized(x, name):
    return keras.layers.ReLU(name=f"{name}_relu")(batch_norm(f"{name}_bn")(x)) if batch_norm else x

  with keras.name_scope("mask_head"):
    features = keras.Input((roi_size, roi_size, channels), dtype=_compute_dtype(),
                           name="mask_roi_features")
    classes = keras.Input((), dtype="int32", name="mask_classes")
    x = features
    for i in range(num_convs):
      x = normalized(EigenConv2D(head_channels, 3, padding="same", activation=activation,
                                 name=f"conv{i}",
                                 kernel_initializer=keras.initializers.VarianceScaling(2.0))(x),
                     f"conv{i}")
    x = normalized(TiledConv2DTranspose(
        head_channels, MASK_SIZE_FACTOR, strides=MASK_SIZE_FACTOR, activation=activation,
        name="upsample", kernel_initializer=keras.initializers.VarianceScaling(2.0))(x),
                   "upsample")
    logits = ClassMaskLogits(mask_classes, name="mask_logits",
                             kernel_initializer=keras.initializers.VarianceScaling(2.0))(
                                 [x, classes])
  return keras.Model([features, classes], logits, name="mask_head")


def sample_rois(proposals, proposal_valid, gt_boxes, gt_classes, gt_masks, s):
  """The sampled RoIs and their targets: no gradient flows through any of them.

  Args:
    proposals: float32 [B, N, 4], proposal_valid bool [B, N].
    gt_boxes: float [B, K, 4]; gt_classes: int [B, K], -1 = not an object;
    gt_masks: float [B, K, m, m], each box's mask crop (inputs.py).
    s: the model's `mask_rcnn.TwoStageSettings` (sample size, positive share and IoU,
      mask size).

  Returns:
    (rois float32 [B, S, 4], class_targets int32 [B, S] (0 background),
     box_targets float32 [B, S, 4], valid bool [B, S], is_positive bool [B, S],
     mask_targets float32 [B, P, 28, 28], 0 or 1; P = mask_training_rois).
  """
  gt_boxes = tf.cast(gt_boxes, tf.float32)  # [B, K, 4]
  gt_classes = tf.cast(gt_classes, tf.int32)  # [B, K], -1 = not an object
  gt_real = gt_classes >= 0
  candidates = tf.concat([proposals, gt_boxes], axis=1)  # The ground truth is a proposal too.
  candidate_valid = tf.concat([proposal_valid, gt_real], axis=1)
  overlaps = tf.where(gt_real[:, None, :], box_ops.iou(candidates, gt_boxes), -1.0)
  best_iou = tf.reduce_max(overlaps, axis=-1)
  matched = tf.argmax(overlaps, axis=-1, output_type=tf.int32)
  positive = candidate_valid & (best_iou >= s.roi_positive_iou)
  negative = candidate_valid & (best_iou < s.roi_positive_iou)
  index, is_positive, valid = roi_ops.sample_fixed(positive, negative, s.num_sampled_rois,
                                                   s.roi_positive_fraction)
  rois = tf.gather(candidates, index, batch_dims=1)
  matched = tf.gather(matched, index, batch_dims=1)
  matched_boxes = tf.gather(gt_boxes, matched, batch_dims=1)
  matched_classes = tf.gather(gt_classes, matched, batch_dims=1)
  class_targets = tf.where(is_positive, matched_classes + 1, 0)
  box_targets = tf.where(is_positive[..., None],
                         box_ops.encode_boxes(matched_boxes, rois, ROI_BOX_WEIGHTS), 0.0)
  p = s.mask_training_rois  # Positives fill the first slots of the sample.
  gt_masks = tf.gather(tf.cast(gt_masks, tf.float32), matched[:, :p], batch_dims=1)
  mask_targets = roi_ops.crop_and_resample(gt_masks, matched_boxes[:, :p], rois[:, :p],
                                           s.mask_size)
  mask_targets = tf.cast(mask_targets >= 0.5, tf.float32)
  return rois, class_targets, box_targets, valid, is_positive, mask_targets


def roi_losses(outputs, *, huber_delta: float) -> Dict[str, tf.Tensor]:
  """The second stage's per-image losses from the training outputs: {name: float32 [B]}.

  "roi_class_loss": softmax cross-entropy over the sampled RoIs (0 = background) and
  "roi_box_loss": Huber (huber_delta) of the positive RoIs' class deltas, both divided
  by the image's sampled RoIs; "mask_loss": per-pixel sigmoid cross-entropy of the
  positive RoIs' masks, divided by the image's positive mask RoIs.
  """
  valid = outputs["roi_valid"]
  positive = tf.cast(outputs["roi_class_targets"] > 0, tf.float32)
  cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=outputs["roi_class_targets"], logits=outputs["roi_class_logits"])
  huber = tf.reduce_sum(detection_losses.huber_loss(
      outputs["roi_box_targets"], outputs["roi_box_deltas"], huber_delta), axis=-1)
  sampled = tf.reduce_sum(valid, axis=1)
  mask_valid = outputs["mask_valid"]
  pixel_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
      labels=outputs["mask_targets"], logits=outputs["mask_logits"]), axis=[2, 3])
  return {
      "roi_class_loss": per_image(tf.reduce_sum(cross_entropy * valid, axis=1), sampled),
      "roi_box_loss": per_image(tf.reduce_sum(huber * positive * valid, axis=1), sampled),
      "mask_loss": per_image(tf.reduce_sum(pixel_loss * mask_valid, axis=1),
                             tf.reduce_sum(mask_valid, axis=1)),
  }
