"""The plain Keras 3 train loop the reference sides of the ResNet-50 comparison share.

keras.applications (ours_worker.py) and keras-hub (keras_hub_worker.py) are
trained identically: the same fixed synthetic batch as our task's synthetic
inputs (one image, tiled), SGD momentum 0.9 at lr 0.1 (Keras 3's optimizer), a
GradientTape step with the loss in float32, several steps per tf.function call.
"""

import keras
import tensorflow as tf

import experiment
import harness


def time_sgd_steps(model: keras.Model, batch: int, warmup: int, steps: int) -> dict:
  """Warms up, then times `steps` SGD steps of `model`; images/s, s/step, faults/step, loss."""
  optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  optimizer.build(model.trainable_variables)

  def step(batch_):
    x, y = batch_
    with tf.GradientTape() as tape:
      logits = tf.cast(model(x, training=True), tf.float32)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                            logits=logits))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  run = harness.host_loop(step, experiment.synthetic_batch(batch))
  run(warmup)  # Traces; runs the warm-up steps.
  result, loss = harness.timed_steps(run, batch, steps)
  result["loss"] = loss
  return result
