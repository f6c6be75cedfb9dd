"""Train-step throughput and MFU, measured through the real Trainer.

MFU = achieved model FLOP/s / peak matmul FLOP/s, where the peak is measured on
this machine in the same process (a large matmul in the run's precision), so
the figure stays meaningful on a shared, noisy CPU. Training FLOPs are taken as
3x the forward FLOPs of the convolutions and dense layers (backward = 2x forward).
"""

import os
import tempfile
import time
from typing import Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from tpu_models import config as config_lib


def forward_flops(model: keras.Model) -> float:
  """FLOPs (2 per multiply-add) of one example through the Conv2D and Dense layers."""
  total = 0.0
  for layer in _leaf_layers(model):
    if isinstance(layer, keras.layers.Conv2D) and not isinstance(layer,
                                                                 keras.layers.DepthwiseConv2D):
      out = layer.output.shape  # [B, H, W, C_out]
      kh, kw = layer.kernel_size
      cin = layer.kernel.shape[2]
      total += 2.0 * out[1] * out[2] * out[3] * kh * kw * cin
    elif isinstance(layer, keras.layers.DepthwiseConv2D):
      out = layer.output.shape
      kh, kw = layer.kernel_size
      total += 2.0 * out[1] * out[2] * out[3] * kh * kw
    elif isinstance(layer, keras.layers.Dense):
      rows = int(np.prod(layer.output.shape[1:-1])) if len(layer.output.shape) > 2 else 1
      total += 2.0 * rows * layer.kernel.shape[0] * layer.kernel.shape[1]
  return total


def _leaf_layers(model):
  for layer in model.layers:
    if isinstance(layer, keras.Model):
      yield from _leaf_layers(layer)
    else:
      yield layer


def matmul_peak_flops(dtype: str = "float32", size: int = 2048, seconds: float = 2.0) -> float:
  """Measured FLOP/s of a [size, size] @ [size, size] matmul in `dtype` on the CPU."""
  tf_dtype = tf.bfloat16 if dtype == "bfloat16" else tf.float16 if dtype == "float16" else tf.float32
  a = tf.random.normal([size, size], dtype=tf.float32)
  a = tf.cast(a, tf_dtype)

  @tf.function
  def chain(x, n):
    for _ in tf.range(n):
      x = tf.matmul(x, a) * tf.cast(1.0 / size, tf_dtype)  # Keeps values bounded.
    return x

  chain(a, tf.constant(2)).numpy()
  n, elapsed = 4, 0.0
  while elapsed < seconds:
    n *= 2
    start = time.perf_counter()
    chain(a, tf.constant(n)).numpy()
    elapsed = time.perf_counter() - start
  return 2.0 * size ** 3 * n / elapsed


def page_faults() -> Optional[int]:
  """Minor page faults of this process so far (None where `resource` is missing)."""
  try:
    import resource  # pylint: disable=g-import-not-at-top  (POSIX only)
  except ImportError:
    return None
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def train_throughput(config: config_lib.ExperimentConfig, *, steps: int = 20, warmup: int = 5,
                     synthetic: bool = True, model_dir: Optional[str] = None,
                     peak: bool = True) -> Dict[str, float]:
  """Examples/s of `config`'s train step through `Trainer`, plus MFU.

  `synthetic` feeds the task's `synthetic_inputs` (a fixed batch: the model, not
  the input pipeline, is measured); otherwise the real training data.

  Returns a dict: examples_per_second, step_seconds, global_batch, train_flops_per_example,
  achieved_tflops, peak_tflops, mfu, precision, device, page_faults_per_step,
  cpu_seconds_per_step (CPU time of this process, all threads, per timed step: the
  cost that a shared machine's load does not inflate; measured around the whole
  `trainer.train(steps)` call, its loop set-up and metrics row included, so with few
  steps it is a little more than the steps alone).
  """
  from tpu_models.training import progress
  from tpu_models.training.trainer import Trainer
  # One host loop of `warmup` steps (tracing), then one of `steps`: the time is
  # the Trainer's own loop timing, without the checkpoint written at the end.
  overrides = [f"trainer.train_steps={warmup + steps}", f"trainer.steps_per_loop={10 ** 9}",
               f"trainer.checkpoint_every={10 ** 9}", "trainer.tensorboard=false"]
  config = config_lib.override(config, overrides)
  with tempfile.TemporaryDirectory() as tmp:
    run_dir = model_dir or os.path.join(tmp, "run")
    trainer = Trainer(config, run_dir, stream=open(os.devnull, "w"), synthetic_inputs=synthetic)
    trainer.train(steps=warmup)
    faults_before, cpu_before = page_faults(), time.process_time()
    trainer.train(steps=steps)
    faults_after, cpu_seconds = page_faults(), time.process_time() - cpu_before
    timed = progress.read_metrics(run_dir, "train")[-1]
    seconds = timed["seconds_per_step"] * steps
    batch = round(timed["examples_per_second"] * timed["seconds_per_step"])  # The global batch.
    flops = 3.0 * forward_flops(trainer.model)
    trainer.close()
  result = {
      "examples_per_second": batch * steps / seconds,
      "step_seconds": seconds / steps,
      "global_batch": batch,
      "train_flops_per_example": flops,
      "achieved_tflops": flops * batch * steps / seconds / 1e12,
      "precision": trainer.mixed_precision,
      "device": trainer.device,
      # Minor page faults of this process per timed step (None where not measurable):
      # freshly mapped memory each step shows up here (see training/host_memory.py).
      "cpu_seconds_per_step": cpu_seconds / steps,
      "page_faults_per_step": (None if faults_before is None
                               else (faults_after - faults_before) / steps),
  }
  if peak:
    result["peak_tflops"] = matmul_peak_flops(result["precision"]) / 1e12
    result["mfu"] = result["achieved_tflops"] / result["peak_tflops"]
  return result


def format_result(result: Dict[str, float]) -> str:
  line = (f"{result['examples_per_second']:.2f} examples/s "
          f"({result['step_seconds'] * 1000:.1f} ms/step, batch {result['global_batch']}, "
          f"{result['precision']}, {result['device']})")
  if "mfu" in result:
    line += (f", {result['achieved_tflops']:.3f} TFLOP/s of a measured "
             f"{result['peak_tflops']:.3f} peak: MFU {100 * result['mfu']:.1f}%")
  if result.get("page_faults_per_step") is not None:
    line += f", {result['page_faults_per_step']:,.0f} page faults/step"
  return line
