"""Mask R-CNN's region proposal network: its head, its proposals and its loss.

    logits, deltas = rpn_head(pyramid, channels=256, per_location=3)  # [B, N, 1], [B, N, 4]
    boxes, valid = proposals(logits, deltas, anchors, count=1000, clip_size=(1024, 1024),
                             pre_nms_top_k=2000, nms_iou=0.7)        # [B, 1000, 4], [B, 1000]
    losses = rpn_losses(class_targets, box_targets, logits, deltas, batch_size=256,
                        positive_fraction=0.5, huber_delta=1 / 9)  # {name: [B]}

The head is one 3x3 conv + ReLU shared by all levels (with head_batch_norm a BN per
level before the ReLU, Model Garden's RPNHead), then 1x1 convs for A objectness
logits and 4A box deltas per position, flattened in the anchor order of
`anchors.multilevel_anchors` (variables rpn/{conv,class_logits,box_deltas}/...).
Proposals are the best anchors decoded, clipped and NMS'd class-agnostically
(`nms.postprocess`) into exactly `count` boxes; the anchor targets come from the
input pipeline (`anchors.label_anchors`).
"""

from typing import Dict

import keras
import tensorflow as tf

from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import losses as detection_losses
from tpu_models.vision.detection import nms as nms_lib
from tpu_models.vision.detection import roi_ops
from tpu_models.vision.layers import EigenConv2D


def _head_conv(filters: int, kernel_size: int, name: str, **kwargs) -> keras.layers.Layer:
  return EigenConv2D(filters, kernel_size, padding="same", name=name,
                     kernel_initializer=keras.initializers.RandomNormal(stddev=0.01), **kwargs)


def rpn_head(pyramid: Dict[int, keras.KerasTensor], channels: int, per_location: int,
             batch_norm=None):
  """The RPN head on every level: (logits [B, N, 1], deltas [B, N, 4]) in the anchor order.

  batch_norm: None, or a BN layer factory: then the shared conv is followed by
  one BN per level before its ReLU (Model Garden's RPNHead).
  """
  with keras.name_scope("rpn"):
    shared = _head_conv(channels, 3, "conv", activation=None if batch_norm else "relu")
    objectness = _head_conv(per_location, 1, "class_logits")
    deltas = _head_conv(per_location * 4, 1, "box_deltas")
    logits, boxes = [], []
    for level, x in pyramid.items():
      x = shared(x)
      if batch_norm:
        x = batch_norm(f"conv_bn_p{level}")(x)
        x = keras.layers.ReLU(name=f"rpn_relu_p{level}")(x)
      h, w = x.shape[1], x.shape[2]
      logits.append(keras.layers.Reshape((h * w * per_location, 1),
                                         name=f"rpn_class_logits_p{level}")(objectness(x)))
      boxes.append(keras.layers.Reshape((h * w * per_location, 4),
                                        name=f"rpn_box_deltas_p{level}")(deltas(x)))
  return (keras.layers.Concatenate(axis=1, name="rpn_class_logits", dtype="float32")(logits),
          keras.layers.Concatenate(axis=1, name="rpn_box_deltas", dtype="float32")(boxes))


def proposals(rpn_class_logits, rpn_box_deltas, anchors, *, count: int, clip_size,
              pre_nms_top_k: int, nms_iou: float, level_sizes=None, min_size: float = 0.0):
  """The RPN's `count` best boxes after NMS: (boxes float32 [B, count, 4], valid bool [B, count]).

  Args:
    rpn_class_logits: [B, N, 1]; rpn_box_deltas: [B, N, 4] (no gradient flows back).
    anchors: float32 [N, 4].
    count: the fixed number of proposals (padded, `valid` says which are real).
    clip_size: what the boxes are clipped to: (height, width), or float32 [B, 2] per image.
    pre_nms_top_k, nms_iou: candidates before NMS and its IoU threshold.
    level_sizes: None: one top-k and one NMS over all levels; else the anchors per level,
      and the top-k and NMS run within each level (torchvision's RPN filter).
    min_size: with level_sizes, boxes narrower or shorter than this are dropped.
  """
  rpn_class_logits = tf.stop_gradient(rpn_class_logits)
  rpn_box_deltas = tf.stop_gradient(rpn_box_deltas)
  if level_sizes is None:
    found = nms_lib.postprocess(
        rpn_class_logits, rpn_box_deltas, anchors, pre_nms_top_k=pre_nms_top_k,
        score_threshold=0.0, iou_threshold=nms_iou, max_detections=count,
        image_size=clip_size)
  else:
    # torchvision's RPN filter: per level the top-k, boxes clipped, those narrower or
    # shorter than rpn_min_size dropped, NMS within each level, the `count` best kept.
    # Every probability (>= 0) passes -0.5, as every one passes torchvision's ">= 0.0".
    found = nms_lib.postprocess(
        rpn_class_logits, rpn_box_deltas, anchors, pre_nms_top_k=pre_nms_top_k,
        score_threshold=-0.5, iou_threshold=nms_iou, max_detections=count,
        image_size=clip_size, level_sizes=level_sizes, min_size=min_size,
        nms_within_levels=True)
  valid = tf.range(count)[None, :] < found["num_detections"][:, None]
  return found["boxes"], valid


def rpn_losses(class_targets, box_targets, class_logits, box_deltas, *, batch_size: int,
               positive_fraction: float, huber_delta: float, fixed_draw: bool = False
               ) -> Dict[str, tf.Tensor]:
  """Per-image RPN losses on a fixed-size draw of anchors: {name: float32 [B]}.

  Args:
    class_targets: int [B, N] anchor labels (>= 0 positive, -1 negative, -2 ignored);
      box_targets: float [B, N, 4] encoded.
    class_logits: [B, N, 1]; box_deltas: [B, N, 4], the RPN's outputs.
    batch_size, positive_fraction: anchors drawn per image and their largest positive
      share (`roi_ops.sample_fixed`).
    huber_delta: of the positive drawn anchors' box loss.
    fixed_draw: the draw is random in training; True (evaluation) takes the same
      stateless draw every time, so an evaluation's loss does not change between runs.

  Returns:
    {"rpn_class_loss": sigmoid cross-entropy over the drawn anchors, "rpn_box_loss":
    Huber of the positive ones}, each divided by the image's drawn anchors.
  """
  targets = tf.cast(class_targets, tf.int32)
  keys = tf.random.stateless_uniform(tf.shape(targets), [27, 0]) if fixed_draw else None
  index, is_positive, valid = roi_ops.sample_fixed(
      targets >= 0, targets == anchor_ops.NEGATIVE, batch_size, positive_fraction, keys=keys)
  logits = tf.gather(tf.cast(class_logits[..., 0], tf.float32), index, batch_dims=1)
  drawn = tf.cast(valid, tf.float32)
  cross_entropy = tf.nn.sigmoid_cross_entropy_with_logits(
      labels=tf.cast(is_positive, tf.float32), logits=logits)
  deltas = tf.gather(tf.cast(box_deltas, tf.float32), index, batch_dims=1)
  box_targets = tf.gather(tf.cast(box_targets, tf.float32), index, batch_dims=1)
  huber = tf.reduce_sum(detection_losses.huber_loss(box_targets, deltas, huber_delta),
                        axis=-1)
  count = tf.reduce_sum(drawn, axis=1)
  return {
      "rpn_class_loss": per_image(tf.reduce_sum(cross_entropy * drawn, axis=1), count),
      "rpn_box_loss": per_image(
          tf.reduce_sum(huber * tf.cast(is_positive, tf.float32), axis=1), count),
  }


def per_image(sums: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
  """float32 [B]: sums / counts, 0 where an image has nothing to count."""
  return tf.math.divide_no_nan(sums, tf.cast(counts, tf.float32))
