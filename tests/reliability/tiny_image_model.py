"""A tiny image classifier registered for tests/reliability (`--import tiny_image_model`):
classification runs that compile in a second instead of a ResNet's minute."""

import keras

from tpu_models.registry import register_model


@register_model("reliability_tiny_cnn", overwrite=True)
def reliability_tiny_cnn(num_classes: int = 4, channels: int = 3) -> keras.Model:
  inputs = keras.Input((None, None, channels), name="images")
  x = keras.layers.Conv2D(4, 3, strides=2, activation="relu", name="conv")(inputs)
  x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(x)
  return keras.Model(inputs, logits, name="reliability_tiny_cnn")
