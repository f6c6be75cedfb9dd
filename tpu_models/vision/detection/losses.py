"""RetinaNet losses: sigmoid focal loss, Huber box loss, and their (sum, normaliser) pair.

The RetinaNet loss of a batch is

    [ sum over non-ignored anchors a and classes k of FL(logit[a, k], y[a, k])
      + box_loss_weight * sum over positive anchors of mean over the 4
        coordinates of Huber(delta[a] - target[a]) ]  /  number of positives

(Lin et al. 2017). The division is left to the Trainer: `retinanet_loss`
returns the (sum, normaliser) pair of one replica's batch, and the Trainer
sums both over all replicas before dividing (normaliser clamped at >= 1), so
the normaliser is the number of positive anchors in the GLOBAL batch, as in the
references. The box term averages over the 4 coordinates as tensorflow/tpu
(normaliser x 4) and Model Garden (Keras Huber's mean over the last axis) do,
so box_loss_weight 50 and delta 0.1 mean what they mean in their recipes.

Targets come from `anchors.label_anchors`: class_targets >= 0 positive, -1
background (all K class targets 0), -2 ignored (no loss).
"""

from typing import Dict, Optional, Tuple

import tensorflow as tf

from tpu_models.vision.detection.anchors import IGNORE


def sigmoid_focal_loss(labels, logits, alpha: Optional[float] = 0.25,
                       gamma: float = 1.5) -> tf.Tensor:
  """Element-wise sigmoid focal loss.

  FL = alpha_t * (1 - p_t)^gamma * CE(labels, sigmoid(logits)), with p_t the
  probability of the true label and alpha_t = alpha for label 1, 1 - alpha for
  label 0. gamma = 0 and alpha = None give the sigmoid cross-entropy.

  Args:
    labels: [...] 0/1 targets (any real dtype).
    logits: [...] logits (any float dtype; computed in float32).
    alpha: weight of the positive labels, or None for no weighting.
    gamma: focusing exponent >= 0.

  Returns:
    float32 [...] losses.
  """
  logits = tf.cast(logits, tf.float32)
  labels = tf.cast(labels, tf.float32)
  loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
  if gamma:
    # (1 - p_t) = sigmoid(-z) with z = logit for label 1 and -logit for label 0,
    # so (1 - p_t)^gamma = exp(-gamma * softplus(z)): finite with finite
    # gradients for any gamma and any logit, unlike pow(1 - sigmoid(x), gamma).
    signed = tf.where(labels > 0.5, logits, -logits)
    loss *= tf.exp(-gamma * tf.nn.softplus(signed))
  if alpha is not None:
    loss *= labels * alpha + (1.0 - labels) * (1.0 - alpha)
  return loss


def huber_loss(targets, predictions, delta: float = 0.1) -> tf.Tensor:
  """Element-wise Huber loss: 0.5 x^2 for |x| <= delta, else delta (|x| - 0.5 delta).

  Args:
    targets, predictions: [...] float (computed in float32).
    delta: where the quadratic part meets the linear one.

  Returns:
    float32 [...] losses.
  """
  error = tf.abs(tf.cast(predictions, tf.float32) - tf.cast(targets, tf.float32))
  quadratic = tf.minimum(error, delta)
  return 0.5 * quadratic * quadratic + delta * (error - quadratic)


def _example_weights(class_targets: tf.Tensor, weights) -> tf.Tensor:
  """float32 [B, 1] per-example weights (ones when None)."""
  if weights is None:
    return tf.ones_like(class_targets[:, :1], tf.float32)
  return tf.reshape(tf.cast(weights, tf.float32), [-1, 1])


def num_positives(class_targets, weights=None) -> tf.Tensor:
  """The normaliser: float32 [] count of positive anchors (weighted by `weights` [B])."""
  class_targets = tf.convert_to_tensor(class_targets)
  positive = tf.cast(class_targets >= 0, tf.float32)
  return tf.reduce_sum(positive * _example_weights(class_targets, weights))


def focal_loss_sum(class_targets, class_logits, *, num_classes: int,
                   alpha: Optional[float] = 0.25, gamma: float = 1.5,
                   weights=None) -> tf.Tensor:
  """Focal loss summed over all non-ignored anchors and all classes.

  Args:
    class_targets: int [B, N] from the labeler (>= 0 class, -1 background,
      -2 ignored).
    class_logits: float [B, N, num_classes] (the model's "class_logits").
    num_classes: K, the number of real classes (no background slot).
    alpha, gamma: see `sigmoid_focal_loss`.
    weights: optional float [B]; 0 drops an example (padding in evaluation).

  Returns:
    float32 [] the unnormalised sum.
  """
  class_logits = tf.convert_to_tensor(class_logits)
  if class_logits.shape[-1] is not None and class_logits.shape[-1] != num_classes:
    raise ValueError(f"class_logits has {class_logits.shape[-1]} classes in its last "
                     f"dimension (shape {class_logits.shape}); num_classes is {num_classes}.")
  class_targets = tf.cast(class_targets, tf.int32)
  # one_hot of a negative id is all zeros: background anchors target 0 everywhere.
  labels = tf.one_hot(class_targets, num_classes, dtype=tf.float32)
  per_anchor = tf.reduce_sum(sigmoid_focal_loss(labels, class_logits, alpha, gamma), axis=-1)
  counted = tf.cast(class_targets != IGNORE, tf.float32)
  return tf.reduce_sum(per_anchor * counted * _example_weights(class_targets, weights))


def box_loss_sum(class_targets, box_targets, box_deltas, *, delta: float = 0.1,
                 weights=None) -> tf.Tensor:
  """Huber loss summed over positive anchors, averaged over the 4 coordinates.

  Args:
    class_targets: int [B, N] (positives are >= 0).
    box_targets: float [B, N, 4] encoded targets.
    box_deltas: float [B, N, 4] (the model's "box_deltas").
    delta: Huber delta.
    weights: optional float [B]; 0 drops an example.

  Returns:
    float32 [] the unnormalised sum.
  """
  class_targets = tf.cast(class_targets, tf.int32)
  per_anchor = tf.reduce_mean(huber_loss(box_targets, box_deltas, delta), axis=-1)
  positive = tf.cast(class_targets >= 0, tf.float32)
  return tf.reduce_sum(per_anchor * positive * _example_weights(class_targets, weights))


def retinanet_loss_components(class_targets, box_targets, class_logits, box_deltas, *,
                              num_classes: int, alpha: Optional[float] = 0.25,
                              gamma: float = 1.5, delta: float = 0.1,
                              weights=None) -> Dict[str, tf.Tensor]:
  """The parts of `retinanet_loss`, for reporting cls_loss and box_loss separately.

  Returns:
    {"cls_loss_sum", "box_loss_sum", "num_positives"}: float32 scalars of this
    replica's batch; cls_loss = all-reduced cls_loss_sum / all-reduced
    num_positives (clamped at >= 1), likewise box_loss (before box_loss_weight).
  """
  return {
      "cls_loss_sum": focal_loss_sum(class_targets, class_logits, num_classes=num_classes,
                                     alpha=alpha, gamma=gamma, weights=weights),
      "box_loss_sum": box_loss_sum(class_targets, box_targets, box_deltas, delta=delta,
                                   weights=weights),
      "num_positives": num_positives(class_targets, weights),
  }


def retinanet_loss(class_targets, box_targets, class_logits, box_deltas, *, num_classes: int,
                   alpha: Optional[float] = 0.25, gamma: float = 1.5, delta: float = 0.1,
                   box_loss_weight: float = 50.0,
                   weights=None) -> Tuple[tf.Tensor, tf.Tensor]:
  """The RetinaNet loss of one replica's batch as a (sum, normaliser) pair.

  Args:
    class_targets: int [B, N]; box_targets: float [B, N, 4] (from the labeler).
    class_logits: float [B, N, num_classes]; box_deltas: float [B, N, 4] (the
      model's outputs; any float dtype, computed in float32).
    num_classes: K.
    alpha, gamma: focal loss parameters (the COCO recipe: 0.25, 1.5).
    delta: Huber delta (0.1).
    box_loss_weight: weight of the box term (50).
    weights: optional float [B]; examples of weight 0 (padding) add nothing to
      the sum or to the normaliser.

  Returns:
    (loss_sum, normaliser): float32 scalars; loss = loss_sum / max(normaliser, 1)
    after both are summed over replicas.
  """
  parts = retinanet_loss_components(class_targets, box_targets, class_logits, box_deltas,
                                    num_classes=num_classes, alpha=alpha, gamma=gamma,
                                    delta=delta, weights=weights)
  return (parts["cls_loss_sum"] + box_loss_weight * parts["box_loss_sum"],
          parts["num_positives"])
