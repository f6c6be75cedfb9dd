"""Writes the keras-hub ResNet preset fixtures; run where keras-hub is installed.

    pip install keras-hub   # in a separate venv (--system-site-packages) beside ours
    python tests/data/keras_hub/make_fixtures.py

keras-hub builds a small ResNetImageClassifier (its own code: the stem 64 wide
as it requires, narrow later stages) with random weights and BN statistics,
saves it with `save_to_preset` (config.json, model.weights.h5, task.json,
task.weights.h5) and records its own logits on fixed inputs (outputs.npz).
"""

import os

import keras
import keras_hub
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = {"resnet18_narrow": ("basic_block", [2, 2, 2, 2]),
           "resnet50_narrow": ("bottleneck_block", [3, 4, 6, 3])}


def main():
  rng = np.random.default_rng(0)
  keras.utils.set_random_seed(0)
  images = rng.standard_normal((2, 64, 64, 3)).astype(np.float32)
  for name, (block_type, blocks) in PRESETS.items():
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 8, 16, 32], stackwise_num_blocks=blocks,
        stackwise_num_strides=[1, 2, 2, 2], block_type=block_type, use_pre_activation=False,
        image_shape=(64, 64, 3))
    classifier = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=10)
    last = "_2_bn" if block_type == "basic_block" else "_3_bn"
    for layer in backbone.layers:
      if isinstance(layer, keras.layers.BatchNormalization):
        n = layer.gamma.shape[0]
        # A small gamma on each block's last BN keeps the logits of order 1.
        low, high = (0.05, 0.3) if layer.name.endswith(last) else (0.5, 1.5)
        layer.gamma.assign(rng.uniform(low, high, n).astype(np.float32))
        layer.beta.assign(rng.normal(0, 0.1, n).astype(np.float32))
        layer.moving_mean.assign(rng.normal(0, 0.1, n).astype(np.float32))
        layer.moving_variance.assign(rng.uniform(0.5, 1.5, n).astype(np.float32))
    head = classifier.get_layer("predictions")
    head.kernel.assign(rng.normal(0, 0.3, head.kernel.shape).astype(np.float32))
    head.bias.assign(rng.normal(0, 0.1, head.bias.shape).astype(np.float32))
    directory = os.path.join(HERE, name)
    classifier.save_to_preset(directory)
    logits = np.asarray(classifier(images, training=False))
    np.savez(os.path.join(directory, "outputs.npz"), images=images, logits=logits)
    print(f"wrote {directory}: keras-hub {keras_hub.__version__}, |logits| <= "
          f"{np.abs(logits).max():.3f}")


if __name__ == "__main__":
  main()
