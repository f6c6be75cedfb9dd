"""Train step of EfficientNet-B0 and ViT-B/16: ours vs keras-hub's backbones, side by side.

One process per side and model (keras-hub in its venv, ours in the main
environment), each timing the SAME plain loop: a fixed random float32 batch at
224 px, 1000 classes, logits -> sparse softmax cross-entropy, SGD momentum 0.9,
a GradientTape step inside one tf.function (XLA off), float32. The model is the
only difference: keras-hub's EfficientNetImageClassifier (the layout of its
efficientnet_b0 presets: timm's, PyTorch padding) and ViTImageClassifier
(vit_base_patch16_224), ours `efficientnet_b0` / `vit_b16` as built for
training here. Trainable parameters are checked equal.

    python benchmarks/keras_hub/train_step.py --python-keras-hub /work/venv-kerashub/bin/python
    # one side alone (prints one JSON line):
    python benchmarks/keras_hub/train_step.py --side ours --model vit_b16

This is a model-level comparison (both sides in the same hand-written loop),
not our Trainer against keras' fit; one run each, on whatever the machine is
doing at the time.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODELS = ("efficientnet_b0", "vit_b16")
TRAINABLE = {"efficientnet_b0": 5_288_548, "vit_b16": 86_567_656}


def build(side: str, model: str):
  import keras
  if side == "keras_hub":
    import keras_hub
    if model == "efficientnet_b0":
      from keras_hub.src.utils.timm import convert_efficientnet
      config = convert_efficientnet.convert_backbone_config({"architecture": "efficientnet_b0"})
      backbone = keras_hub.models.EfficientNetBackbone(**config, input_shape=(224, 224, 3))
      return keras_hub.models.EfficientNetImageClassifier(backbone=backbone, num_classes=1000)
    backbone = keras_hub.models.ViTBackbone(image_shape=(224, 224, 3), patch_size=16,
                                            num_layers=12, num_heads=12, hidden_dim=768,
                                            mlp_dim=3072)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=1000)
  sys.path.insert(0, REPO)
  import tpu_models
  del keras
  return tpu_models.create_model(model, num_classes=1000, input_shape=[224, 224, 3])


def run_side(side: str, model_name: str, batch: int, warmup: int, steps: int) -> dict:
  import keras
  import numpy as np
  import tensorflow as tf
  model = build(side, model_name)
  trainable = int(sum(np.prod(v.shape) for v in model.trainable_variables))
  if trainable != TRAINABLE[model_name]:
    raise SystemExit(f"{side} {model_name}: {trainable:,} trainable parameters, expected "
                     f"{TRAINABLE[model_name]:,}")
  rng = np.random.default_rng(0)
  images = tf.constant(rng.standard_normal((batch, 224, 224, 3)).astype(np.float32))
  labels = tf.constant(rng.integers(0, 1000, batch).astype(np.int32))
  optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
  optimizer.build(model.trainable_variables)

  @tf.function(jit_compile=False)
  def step():
    with tf.GradientTape() as tape:
      logits = tf.cast(model(images, training=True), tf.float32)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  for _ in range(warmup):
    float(step())
  start = time.perf_counter()
  for _ in range(steps):
    loss = float(step())
  seconds = (time.perf_counter() - start) / steps
  return {"side": side, "model": model_name, "batch": batch, "steps": steps,
          "seconds_per_step": seconds, "images_per_second": batch / seconds,
          "trainable": trainable, "loss": loss}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--side", choices=("ours", "keras_hub"), help="one side alone")
  parser.add_argument("--model", choices=MODELS, default=None)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--python-keras-hub", default="/work/venv-kerashub/bin/python",
                      help="the keras-hub venv's Python (benchmarks/keras_hub/setup_venv.sh)")
  args = parser.parse_args(argv)
  if args.side:
    print(json.dumps(run_side(args.side, args.model or MODELS[0], args.batch, args.warmup,
                              args.steps)))
    return 0
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  rows = []
  for model in ([args.model] if args.model else MODELS):
    result = {}
    for side, python in (("keras_hub", args.python_keras_hub), ("ours", sys.executable)):
      out = subprocess.run([python, os.path.abspath(__file__), "--side", side, "--model", model,
                            "--batch", str(args.batch), "--warmup", str(args.warmup),
                            "--steps", str(args.steps)], env=env, check=True,
                           capture_output=True, text=True).stdout
      result[side] = json.loads(out.strip().splitlines()[-1])
    ratio = result["ours"]["images_per_second"] / result["keras_hub"]["images_per_second"]
    rows.append((model, result, ratio))
  print(f"| model (fp32, 224 px, batch {args.batch}) | keras-hub images/s | ours images/s | "
        f"ours / keras-hub |")
  print("|---|---:|---:|---:|")
  for model, result, ratio in rows:
    print(f"| {model} | {result['keras_hub']['images_per_second']:.2f} | "
          f"{result['ours']['images_per_second']:.2f} | {ratio:.2f}x |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
