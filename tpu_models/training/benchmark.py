"""Train-step throughput and MFU, measured through the real Trainer.

MFU = achieved model FLOP/s / peak matmul FLOP/s, where the peak is measured on
this machine in the same process (a large matmul in the run's precision), so
the figure stays meaningful on a shared, noisy CPU. Training FLOPs are taken as
3x the forward FLOPs of the matmuls and convolutions in the model's traced graph
(backward = 2x forward).
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
  """FLOPs (2 per multiply-add) of one example's inference forward pass.

  The model is traced, never run, as a `tf.function` of `model(x, training=False)`
  on one example: each of its Keras inputs with batch 1 and the input's dtype
  (e.g. float32 [1, H, W, C] images). The matmuls and convolutions of the graph
  are counted from their static shapes, whichever layer holds them: MatMul,
  BatchMatMul (broadcast batch dims), Conv2D / Conv3D (C_in per group),
  DepthwiseConv2dNative, Conv2DBackpropInput (transposed convolution) and
  two-operand Einsum. Elementwise ops, softmax, normalisations, pooling and
  resizing are not counted. Functions the graph calls (while and cond bodies,
  nested tf.functions) are counted from their own traced graphs, once per call:
  a while loop's body as one iteration, a conditional's costliest branch.

  Args:
    model: a Keras model with `keras.Input`s (functional, or a Sequential with an
      input shape) whose dimensions other than the batch are static; any dtype
      policy (mixed_bfloat16 included).

  Returns:
    The forward FLOPs of one example.

  Raises:
    ValueError: the model has no Keras inputs (e.g. a subclassed model), an
      input dimension other than the batch is dynamic, or a counted op's shape
      is not static (e.g. in a nested tf.function traced earlier for a dynamic
      batch).
  """
  try:
    inputs = model.input  # Structured (tensor, list or dict) as the model takes them.
  except (AttributeError, ValueError):
    inputs = getattr(model, "inputs", None)  # A Sequential has only the flat list.
    if isinstance(inputs, list) and len(inputs) == 1:
      inputs = inputs[0]
  if inputs is None:
    raise ValueError(f"forward_flops traces a model's keras.Input specs; model {model.name!r} "
                     f"has none (a subclassed model?).")

  def one_example(tensor):
    dynamic = [axis for axis, size in enumerate(tensor.shape) if axis and size is None]
    if dynamic:
      raise ValueError(f"forward_flops needs static input shapes: dimension {dynamic[0]} of "
                       f"input {tensor.name!r} {tuple(tensor.shape)} is dynamic.")
    return tf.TensorSpec([1, *tensor.shape[1:]], tensor.dtype)

  specs = tf.nest.map_structure(one_example, inputs)
  trace = tf.function(lambda x: model(x, training=False)).get_concrete_function(specs)
  return float(_graph_flops(trace.graph))


# Ops whose called functions are alternatives: only the costliest one runs.
_BRANCHING_OPS = ("If", "StatelessIf", "Case", "StatelessCase")


def _graph_flops(graph: tf.Graph) -> float:
  """`_op_flops` summed over `graph`'s ops and the functions they call."""
  total = 0.0
  for op in graph.get_operations():
    total += _op_flops(op)
    # While/If bodies and nested tf.functions live in the function library.
    called = [_graph_flops(graph._get_function(f.name).graph)  # pylint: disable=protected-access
              for attr in op.node_def.attr.values()
              for f in ([attr.func] if attr.HasField("func") else attr.list.func)]
    if called:
      total += max(called) if op.type in _BRANCHING_OPS else sum(called)
  return total


def _op_flops(op: tf.Operation) -> float:
  """FLOPs of one matmul, convolution or einsum op (0 for any other op)."""
  if op.type not in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D",
                     "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Einsum"):
    return 0.0
  if not all(t.shape.is_fully_defined() for t in (*op.inputs, *op.outputs)):
    raise ValueError(f"forward_flops needs static shapes; {op.type} op {op.name!r} has inputs "
                     f"{[t.shape for t in op.inputs]}.")
  shapes = [t.shape.as_list() for t in op.inputs]
  outputs = float(op.outputs[0].shape.num_elements())
  if op.type == "MatMul" or op.type.startswith("BatchMatMul"):
    # Each output element (broadcast batch x m x n) is a k-long dot product.
    transposed = op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x")
    return 2.0 * outputs * shapes[0][-2 if transposed else -1]
  if op.type in ("Conv2D", "Conv3D"):  # Filter [kh, kw, C_in / groups, C_out] (3D: kd first).
    return 2.0 * outputs * np.prod(shapes[1][:-1])
  if op.type == "DepthwiseConv2dNative":  # Filter [kh, kw, C_in, multiplier].
    return 2.0 * outputs * np.prod(shapes[1][:2])
  if op.type == "Conv2DBackpropInput":  # Each input element feeds kh x kw x C_out outputs.
    return 2.0 * np.prod(shapes[2]) * np.prod(shapes[1][:3])
  return _einsum_flops(op.get_attr("equation").decode(), shapes)


def _einsum_flops(equation: str, shapes) -> float:
  """2 x the product of the sizes of every index letter (and of the broadcast "...")."""
  operands = equation.replace(" ", "").split("->")[0].split(",")
  if len(operands) != 2:  # One operand is a transpose or a reduction, not a product.
    return 0.0
  sizes, ellipses = {}, []
  for letters, shape in zip(operands, shapes):
    if "..." in letters:
      head, tail = letters.split("...")
      ellipses.append(tuple(shape[len(head):len(shape) - len(tail)]))
      letters, shape = head + tail, shape[:len(head)] + shape[len(shape) - len(tail):]
    for letter, size in zip(letters, shape):
      sizes[letter] = max(size, sizes.get(letter, 1))  # A size-1 axis broadcasts.
  return 2.0 * np.prod(list(sizes.values())) * np.prod(np.broadcast_shapes(*ellipses))


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


def measurement_config(config: config_lib.ExperimentConfig,
                       total_steps: int) -> config_lib.ExperimentConfig:
  """`config` for timing `total_steps` train steps through `Trainer`.

  Each `trainer.train(steps=n)` call then runs as one host loop of n steps (so a
  warm-up call and a measured call are timed apart), and nothing is checkpointed
  or written to TensorBoard on the way.
  """
  return config_lib.override(config, [
      f"trainer.train_steps={total_steps}", f"trainer.steps_per_loop={10 ** 9}",
      f"trainer.checkpoint_every={10 ** 9}", "trainer.tensorboard=false"])


def train_throughput(config: config_lib.ExperimentConfig, *, steps: int = 20, warmup: int = 5,
                     synthetic: bool = True, model_dir: Optional[str] = None,
                     peak: bool = True) -> Dict[str, float]:
  """Examples/s of `config`'s train step through `Trainer`, plus MFU.

  `synthetic` feeds the task's `synthetic_inputs` (a fixed batch: the model, not
  the input pipeline, is measured); otherwise the real training data.

  Returns a dict: examples_per_second, step_seconds, global_batch, train_flops_per_example,
  achieved_tflops, peak_tflops, mfu, precision, device, page_faults_per_step,
  cpu_seconds_per_step (CPU time of this process, all threads, per timed step: the
  cost that a shared machine's load does not inflate; the Trainer's own measure
  around its host loop, as the step time: not the checkpoint written after it). train_flops_per_example,
  achieved_tflops and mfu are None for a model `forward_flops` cannot trace (no
  static Keras inputs, e.g. a subclassed model).
  """
  from tpu_models.training import progress
  from tpu_models.training.trainer import Trainer
  # One host loop of `warmup` steps (tracing), then one of `steps`: the time is
  # the Trainer's own loop timing, without the checkpoint written at the end.
  config = measurement_config(config, warmup + steps)
  with tempfile.TemporaryDirectory() as tmp:
    run_dir = model_dir or os.path.join(tmp, "run")
    trainer = Trainer(config, run_dir, stream=open(os.devnull, "w"), synthetic_inputs=synthetic)
    trainer.train(steps=warmup)
    faults_before = page_faults()
    trainer.train(steps=steps)
    faults_after = page_faults()
    timed = progress.read_metrics(run_dir, "train")[-1]
    seconds = timed["seconds_per_step"] * steps
    batch = round(timed["examples_per_second"] * timed["seconds_per_step"])  # The global batch.
    try:
      flops = 3.0 * forward_flops(trainer.model)
    except ValueError:  # No static keras.Input to trace: the throughput still stands.
      flops = None
    trainer.close()
  result = {
      "examples_per_second": batch * steps / seconds,
      "step_seconds": seconds / steps,
      "global_batch": batch,
      "train_flops_per_example": flops,
      "achieved_tflops": None if flops is None else flops * batch * steps / seconds / 1e12,
      "precision": trainer.mixed_precision,
      "device": trainer.device,
      # Minor page faults of this process per timed step (None where not measurable):
      # freshly mapped memory each step shows up here (see training/host_memory.py).
      "cpu_seconds_per_step": timed["cpu_seconds_per_step"],
      "page_faults_per_step": (None if faults_before is None
                               else (faults_after - faults_before) / steps),
  }
  if peak:
    result["peak_tflops"] = matmul_peak_flops(result["precision"]) / 1e12
    result["mfu"] = (None if flops is None
                     else result["achieved_tflops"] / result["peak_tflops"])
  return result


def format_result(result: Dict[str, float]) -> str:
  line = (f"{result['examples_per_second']:.2f} examples/s "
          f"({result['step_seconds'] * 1000:.1f} ms/step, batch {result['global_batch']}, "
          f"{result['precision']}, {result['device']})")
  if result.get("mfu") is not None:
    line += (f", {result['achieved_tflops']:.3f} TFLOP/s of a measured "
             f"{result['peak_tflops']:.3f} peak: MFU {100 * result['mfu']:.1f}%")
  if result.get("page_faults_per_step") is not None:
    line += f", {result['page_faults_per_step']:,.0f} page faults/step"
  return line
