"""Tests of tpu_models.vision.detection.losses against direct NumPy formulas."""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.detection import losses


def _np_sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _np_focal(labels, logits, alpha, gamma):
  """The paper's formula, written directly (float64)."""
  p = _np_sigmoid(logits.astype(np.float64))
  ce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
  p_t = labels * p + (1 - labels) * (1 - p)
  loss = (1 - p_t)**gamma * ce
  if alpha is not None:
    loss *= labels * alpha + (1 - labels) * (1 - alpha)
  return loss


def _np_huber(x, delta):
  x = np.abs(x)
  return np.where(x <= delta, 0.5 * x * x, delta * (x - 0.5 * delta))


@pytest.mark.parametrize("alpha,gamma", [(0.25, 1.5), (0.25, 2.0), (None, 1.5), (0.5, 0.0)])
def test_focal_loss_equals_numpy_formula(alpha, gamma):
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 3, (64, 5)).astype(np.float32)
  labels = (rng.uniform(size=(64, 5)) < 0.3).astype(np.float32)
  got = losses.sigmoid_focal_loss(labels, logits, alpha, gamma).numpy()
  np.testing.assert_allclose(got, _np_focal(labels, logits, alpha, gamma), rtol=1e-5,
                             atol=1e-7)


def test_gamma_zero_without_alpha_is_sigmoid_cross_entropy():
  rng = np.random.default_rng(1)
  logits = rng.normal(0, 4, (100,)).astype(np.float32)
  labels = (rng.uniform(size=100) < 0.5).astype(np.float32)
  got = losses.sigmoid_focal_loss(labels, logits, alpha=None, gamma=0.0).numpy()
  expected = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits).numpy()
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  p = _np_sigmoid(logits.astype(np.float64))
  np.testing.assert_allclose(got, -(labels * np.log(p) + (1 - labels) * np.log(1 - p)),
                             rtol=1e-5)


def test_focal_loss_is_finite_with_finite_gradients_at_extreme_logits():
  logits = tf.constant([-100.0, -20.0, 0.0, 20.0, 100.0] * 2)
  labels = tf.constant([0.0] * 5 + [1.0] * 5)
  for gamma in (0.5, 1.5, 2.0):
    with tf.GradientTape() as tape:
      tape.watch(logits)
      loss = losses.sigmoid_focal_loss(labels, logits, 0.25, gamma)
    grad = tape.gradient(loss, logits)
    assert np.all(np.isfinite(loss.numpy())) and np.all(np.isfinite(grad.numpy()))
  # A confident right answer costs (almost) nothing, a confident wrong one a lot.
  assert loss.numpy()[0] < 1e-30 and loss.numpy()[4] > 10


def test_huber_hand_computed():
  errors = np.array([0.0, 0.05, -0.1, 0.3, -2.0], np.float32)
  got = losses.huber_loss(np.zeros(5), errors, delta=0.1).numpy()
  np.testing.assert_allclose(got, [0.0, 0.00125, 0.005, 0.025, 0.195], rtol=1e-5)
  np.testing.assert_allclose(got, _np_huber(errors, 0.1), rtol=1e-6)


def _batch(seed=2, batch=2, anchors=30, classes=4):
  rng = np.random.default_rng(seed)
  class_targets = rng.choice([-2, -1, -1, -1, 0, 1, 2, 3], size=(batch, anchors)).astype(np.int32)
  box_targets = np.where(class_targets[..., None] >= 0,
                         rng.normal(0, 0.3, (batch, anchors, 4)), 0.0).astype(np.float32)
  class_logits = rng.normal(-2, 2, (batch, anchors, classes)).astype(np.float32)
  box_deltas = rng.normal(0, 0.3, (batch, anchors, 4)).astype(np.float32)
  return class_targets, box_targets, class_logits, box_deltas


def _np_retinanet_sums(class_targets, box_targets, class_logits, box_deltas, alpha=0.25,
                       gamma=1.5, delta=0.1):
  """Loops over anchors: (focal sum, box sum, positives)."""
  cls_sum = box_sum = positives = 0.0
  num_classes = class_logits.shape[-1]
  for b in range(class_targets.shape[0]):
    for a in range(class_targets.shape[1]):
      target = class_targets[b, a]
      if target == -2:
        continue
      onehot = np.array([1.0 if k == target else 0.0 for k in range(num_classes)])
      cls_sum += _np_focal(onehot, class_logits[b, a], alpha, gamma).sum()
      if target >= 0:
        positives += 1
        box_sum += _np_huber(box_deltas[b, a] - box_targets[b, a], delta).mean()
  return cls_sum, box_sum, positives


def test_retinanet_loss_equals_an_anchor_loop():
  inputs = _batch()
  cls_sum, box_sum, positives = _np_retinanet_sums(*inputs)
  parts = losses.retinanet_loss_components(*inputs, num_classes=4)
  np.testing.assert_allclose(parts["cls_loss_sum"].numpy(), cls_sum, rtol=1e-5)
  np.testing.assert_allclose(parts["box_loss_sum"].numpy(), box_sum, rtol=1e-5)
  assert parts["num_positives"].numpy() == positives == np.sum(inputs[0] >= 0)
  total, normaliser = losses.retinanet_loss(*inputs, num_classes=4)
  np.testing.assert_allclose(total.numpy(), cls_sum + 50.0 * box_sum, rtol=1e-5)
  assert normaliser.numpy() == positives
  assert total.dtype == tf.float32 and normaliser.dtype == tf.float32
  assert total.shape == () and normaliser.shape == ()


def test_ignored_anchors_contribute_nothing_and_background_targets_zero():
  class_targets, box_targets, class_logits, box_deltas = _batch()
  base = losses.retinanet_loss(class_targets, box_targets, class_logits, box_deltas,
                               num_classes=4)
  ignored = class_targets == -2
  assert ignored.any()
  changed_logits = np.where(ignored[..., None], 50.0, class_logits).astype(np.float32)
  changed_deltas = np.where(ignored[..., None], 9.0, box_deltas).astype(np.float32)
  again = losses.retinanet_loss(class_targets, box_targets, changed_logits, changed_deltas,
                                num_classes=4)
  np.testing.assert_allclose(again[0].numpy(), base[0].numpy(), rtol=1e-6)
  # Turning the ignored anchors into background adds their loss for all classes.
  as_background = np.where(ignored, -1, class_targets)
  more = losses.focal_loss_sum(as_background, class_logits, num_classes=4).numpy()
  extra = _np_focal(np.zeros(4), class_logits[ignored], 0.25, 1.5).sum()
  np.testing.assert_allclose(more - losses.focal_loss_sum(class_targets, class_logits,
                                                          num_classes=4).numpy(),
                             extra, rtol=1e-4)


def test_zero_weight_examples_add_nothing_to_sum_or_normaliser():
  class_targets, box_targets, class_logits, box_deltas = _batch(batch=3)
  weighted = losses.retinanet_loss(class_targets, box_targets, class_logits, box_deltas,
                                   num_classes=4, weights=np.array([1.0, 0.0, 1.0]))
  kept = [0, 2]
  alone = losses.retinanet_loss(class_targets[kept], box_targets[kept], class_logits[kept],
                                box_deltas[kept], num_classes=4)
  np.testing.assert_allclose(weighted[0].numpy(), alone[0].numpy(), rtol=1e-6)
  assert weighted[1].numpy() == alone[1].numpy() == np.sum(class_targets[kept] >= 0)
  # A padded evaluation example has all-zero labels (class 0 "positive"
  # everywhere); weight 0 still makes it count for nothing.
  padded = np.zeros_like(class_targets)
  weights = np.array([0.0, 0.0, 0.0])
  nothing = losses.retinanet_loss(padded, box_targets, class_logits, box_deltas,
                                  num_classes=4, weights=weights)
  assert nothing[0].numpy() == 0.0 and nothing[1].numpy() == 0.0


def test_normaliser_counts_positives():
  class_targets = np.array([[0, -1, -2, 3, 3], [-1, -1, -1, -1, -2]], np.int32)
  assert losses.num_positives(class_targets).numpy() == 3.0
  assert losses.num_positives(class_targets, weights=[0.0, 1.0]).numpy() == 0.0
  # Only positives carry box loss: a box error on a negative anchor costs nothing.
  box_targets = np.zeros([2, 5, 4], np.float32)
  deltas = np.zeros([2, 5, 4], np.float32)
  deltas[0, 1] = 5.0  # Negative anchor.
  deltas[0, 3, 0] = 1.0  # Positive anchor, one coordinate off by 1: Huber 0.095, / 4.
  got = losses.box_loss_sum(class_targets, box_targets, deltas, delta=0.1).numpy()
  np.testing.assert_allclose(got, 0.095 / 4, rtol=1e-5)


def test_low_precision_inputs_give_float32_losses_and_xla_compiles():
  class_targets, box_targets, class_logits, box_deltas = _batch()
  bf16 = losses.retinanet_loss(class_targets, box_targets, tf.cast(class_logits, tf.bfloat16),
                               tf.cast(box_deltas, tf.bfloat16), num_classes=4)
  assert bf16[0].dtype == tf.float32
  reference = losses.retinanet_loss(class_targets, box_targets, class_logits, box_deltas,
                                    num_classes=4)
  np.testing.assert_allclose(bf16[0].numpy(), reference[0].numpy(), rtol=2e-2)

  @tf.function(jit_compile=True)
  def compiled(*args):
    return losses.retinanet_loss(*args, num_classes=4, weights=tf.ones([2]))

  got = compiled(class_targets, box_targets, class_logits, box_deltas)
  np.testing.assert_allclose(got[0].numpy(), reference[0].numpy(), rtol=1e-5)
  assert got[1].numpy() == reference[1].numpy()


def test_class_count_mismatch_is_rejected():
  class_targets, box_targets, class_logits, box_deltas = _batch()
  with pytest.raises(ValueError, match="num_classes is 5"):
    losses.retinanet_loss(class_targets, box_targets, class_logits, box_deltas, num_classes=5)
