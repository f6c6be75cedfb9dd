"""1x1 convolutions: Conv2D kernel vs one matmul, forward + backward, per ResNet-50 shape.

Why `PointwiseConv2D` (tpu_models/vision/layers.py) computes 1x1 stride-1
convolutions as matmuls in bfloat16 and as convolutions in float32. For each
1x1 layer shape of ResNet-50 at batch 32, the layer with `as_matmul=False` and
`as_matmul=True` (same input, same kernel, the run's dtype policy) runs
alternately in one process, and the median time of a forward+backward step
(input and kernel gradients) is printed with the ratio.

    python benchmarks/classification/pointwise_conv.py                      # bfloat16 and float32
    python benchmarks/classification/pointwise_conv.py --precisions bfloat16 --repeats 9
"""

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from tpu_models.vision.layers import PointwiseConv2D

# (height = width, C_in, C_out) of ResNet-50's 1x1 stride-1 layers at 224 px.
SHAPES = [(56, 64, 256), (56, 256, 64), (28, 512, 128), (28, 128, 512), (14, 1024, 256),
          (14, 256, 1024), (7, 2048, 512), (7, 512, 2048)]


def _step(layer: PointwiseConv2D):
  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(tf.cast(layer(x), tf.float32))
    return tape.gradient(loss, [x, layer.kernel])
  return step


def measure(size: int, c_in: int, c_out: int, batch: int, precision: str, repeats: int):
  """Median seconds of one forward+backward step of the layer as Conv2D and as matmul."""
  policy = "mixed_bfloat16" if precision == "bfloat16" else "float32"
  x = tf.cast(tf.random.normal([batch, size, size, c_in]), keras.DTypePolicy(policy).compute_dtype)
  layers = {name: PointwiseConv2D(c_out, 1, use_bias=False, dtype=policy, as_matmul=as_matmul)
            for name, as_matmul in (("conv", False), ("matmul", True))}
  layers["conv"].build(x.shape)
  layers["matmul"].build(x.shape)
  layers["matmul"].set_weights(layers["conv"].get_weights())  # The same kernel.
  steps = {name: _step(layer) for name, layer in layers.items()}
  times = {name: [] for name in steps}
  for step in steps.values():  # Trace and warm up.
    step(x)[1].numpy()
  for _ in range(repeats):  # Alternate, so load on the machine hits both.
    for name, step in steps.items():
      start = time.perf_counter()
      step(x)[1].numpy()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def main():
  parser = harness.script_parser(__doc__)
  parser.add_argument("--precisions", default="bfloat16,float32")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  print("| precision | shape (HxW, C_in -> C_out) | Conv2D ms | matmul ms | Conv2D / matmul |")
  print("|---|---|---:|---:|---:|")
  for precision in args.precisions.split(","):
    for size, c_in, c_out in SHAPES:
      t = measure(size, c_in, c_out, args.batch, precision, args.repeats)
      print(f"| {precision} | {size}x{size}, {c_in} -> {c_out} | {t['conv'] * 1e3:.1f} | "
            f"{t['matmul'] * 1e3:.1f} | {t['conv'] / t['matmul']:.2f}x |", flush=True)


if __name__ == "__main__":
  main()
