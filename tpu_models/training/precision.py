"""Mixed precision: the Keras dtype policy while a model is built, and loss scaling.

    runtime.mixed_precision   compute   variables   loss scaling
    float32                   float32   float32     -
    bfloat16                  bfloat16  float32     - (bf16 has float32's range)
    float16                   float16   float32     dynamic (LossScaleOptimizer)
    auto                      bfloat16 where the hardware computes it natively, else float32

Logits and losses stay float32 in every model (their last layer is float32).

`auto` (`choose_precision`) picks bfloat16 on TPUs, on GPUs of compute
capability >= 8.0 and on CPUs with AVX512_BF16 or AMX; elsewhere bfloat16 is
emulated and slower than float32 (up to 8.8x for a train step on an
AVX2-only CPU), so it picks float32. The Trainer logs the choice and its reason.
"""

import contextlib
import os
from typing import Iterable, Optional, Sequence, Tuple

import keras

from tpu_models.errors import ConfigError

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
AUTO = "auto"

# /proc/cpuinfo flags of CPU instructions that compute bfloat16 natively.
_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# ONEDNN_MAX_CPU_ISA values that still allow oneDNN's bfloat16 instructions.
_BF16_ONEDNN_ISAS = ("ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                     "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX",
                     "AVX10_1_512_AMX_FP16")


def choose_precision(device: str, *, gpu_compute_capabilities: Sequence[Tuple[int, int]] = (),
                     cpu_flags: Optional[Iterable[str]] = None,
                     onednn_max_isa: Optional[str] = None) -> Tuple[str, str]:
  """What `runtime.mixed_precision: auto` means on this hardware, and why.

  Args:
    device: "tpu", "gpu" or "cpu" (`distribute.device_kind`).
    gpu_compute_capabilities: (major, minor) of every GPU the replicas use.
    cpu_flags: the CPU's feature flags (as in /proc/cpuinfo), or None where unknown.
    onednn_max_isa: the value of $ONEDNN_MAX_CPU_ISA, if set.

  Returns:
    ("bfloat16" or "float32", a short reason naming what was decided on).
  """
  if device == "tpu":
    return "bfloat16", "TPUs compute bfloat16 natively"
  if device == "gpu":
    if not gpu_compute_capabilities:
      return "float32", "the GPU's compute capability is unknown"
    lowest = min(tuple(c) for c in gpu_compute_capabilities)
    if lowest >= (8, 0):
      return "bfloat16", f"GPU compute capability {lowest[0]}.{lowest[1]} >= 8.0"
    return "float32", (f"GPU compute capability {lowest[0]}.{lowest[1]} < 8.0 has no native "
                       f"bfloat16")
  if cpu_flags is None:
    return "float32", "cannot tell whether this CPU computes bfloat16 natively"
  native = sorted(set(_BF16_CPU_FLAGS) & set(cpu_flags))
  if not native:
    return "float32", "this CPU has neither AVX512_BF16 nor AMX (bfloat16 would be emulated)"
  if onednn_max_isa and onednn_max_isa.strip().upper() not in _BF16_ONEDNN_ISAS:
    return "float32", (f"ONEDNN_MAX_CPU_ISA={onednn_max_isa} keeps oneDNN from this CPU's "
                       f"{'/'.join(native)}")
  return "bfloat16", f"this CPU computes bfloat16 natively ({', '.join(native)})"


def linux_cpu_flags(path: str = "/proc/cpuinfo") -> Optional[frozenset]:
  """The feature flags of the first CPU in `path` (Linux), or None where there are none."""
  try:
    with open(path) as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
          return frozenset(value.split())
  except OSError:
    pass
  return None


def resolve_precision(mixed_precision: str, device: str) -> Tuple[str, str]:
  """`mixed_precision`, with `auto` replaced by this machine's choice; (value, reason or "")."""
  if mixed_precision != AUTO:
    return mixed_precision, ""
  capabilities = []
  if device == "gpu":
    import tensorflow as tf  # Deferred: only to describe GPUs.
    for gpu in tf.config.list_physical_devices("GPU"):
      capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
      if capability:
        capabilities.append(tuple(capability))
  return choose_precision(device, gpu_compute_capabilities=capabilities,
                          cpu_flags=linux_cpu_flags() if device == "cpu" else None,
                          onednn_max_isa=os.environ.get("ONEDNN_MAX_CPU_ISA"))


@contextlib.contextmanager
def precision_policy(mixed_precision: str):
  """Sets the Keras dtype policy while a model is built, then restores it."""
  if mixed_precision not in POLICIES:
    raise ConfigError(f"runtime.mixed_precision must be one of {', '.join(POLICIES)} "
                      f"(auto is resolved by resolve_precision first), got {mixed_precision!r}.")
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(POLICIES[mixed_precision])
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy(previous)


def uses_loss_scaling(mixed_precision: str) -> bool:
  """float16 needs loss scaling; float32 and bfloat16 do not."""
  return mixed_precision == "float16"


def with_loss_scaling(optimizer: keras.optimizers.Optimizer, variables,
                      initial_scale: Optional[float] = None) -> keras.optimizers.Optimizer:
  """Wraps `optimizer` in Keras' dynamic LossScaleOptimizer (skip + halve on overflow)."""
  kwargs = {} if initial_scale is None else {"initial_scale": float(initial_scale)}
  scaled = keras.optimizers.LossScaleOptimizer(optimizer, **kwargs)
  scaled.build(variables)
  return scaled


def loss_scale(optimizer: keras.optimizers.Optimizer):
  """The current dynamic loss scale (a variable), or None without loss scaling."""
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return optimizer.dynamic_scale
  return None
