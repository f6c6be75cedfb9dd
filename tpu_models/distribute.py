"""A `tf.distribute` strategy from a name, so one config runs everywhere.

    auto            TPU if $TPU_NAME is set or this is a TPU VM (and it can be reached),
                    else multi_worker if TF_CONFIG is set, else the local GPUs, else the CPU
    cpu             OneDeviceStrategy on /cpu:0
    gpu, mirrored   MirroredStrategy over the local GPUs (CPU if there are none)
    multi_worker    MultiWorkerMirroredStrategy; the cluster comes from TF_CONFIG
    tpu             TPUStrategy on the TPU named by $TPU_NAME, or `local` on a TPU VM
    tpu:<name>      TPUStrategy on a named TPU or a grpc://host:port address
"""

import json
import logging
import os
from typing import List, Optional

import tensorflow as tf
from tpu_models.errors import ConfigError

log = logging.getLogger(__name__)

STRATEGY_NAMES = ("auto", "cpu", "gpu", "mirrored", "multi_worker", "tpu", "tpu:<name>")

_tpu_strategies = {}  # A TPU system may be initialized only once per process.


def get_strategy(name: str = "auto") -> tf.distribute.Strategy:
  """Returns the strategy called `name` (see the module docstring)."""
  name = (name or "auto").strip()
  if name == "auto":
    return _auto()
  if name == "cpu":
    return tf.distribute.OneDeviceStrategy("/cpu:0")
  if name in ("gpu", "mirrored"):
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
      log.warning("strategy %r: no GPU found, mirroring over the CPU.", name)
    return tf.distribute.MirroredStrategy()
  if name == "multi_worker":
    return _multi_worker()
  if name == "tpu" or name.startswith("tpu:"):
    return _tpu(name.partition(":")[2] or os.environ.get("TPU_NAME", "local"))
  raise ConfigError(f"Unknown strategy {name!r}; expected one of {', '.join(STRATEGY_NAMES)}.")


def _auto() -> tf.distribute.Strategy:
  if os.environ.get("TPU_NAME") or _on_tpu_vm():
    try:
      return _tpu(os.environ.get("TPU_NAME", "local"))
    except (ValueError, RuntimeError, tf.errors.OpError) as e:  # pragma: no cover - TPU hosts
      log.warning("A TPU looked available but could not be reached (%s); not using it.", e)
  if os.environ.get("TF_CONFIG"):
    return _multi_worker()
  if len(tf.config.list_logical_devices("GPU")) > 1:
    return tf.distribute.MirroredStrategy()
  if tf.config.list_logical_devices("GPU"):
    return tf.distribute.OneDeviceStrategy("/gpu:0")
  return tf.distribute.OneDeviceStrategy("/cpu:0")


def _on_tpu_vm() -> bool:
  # TPU VMs expose their chips as /dev/accel* (v4+) or /dev/vfio (v5e+).
  return os.path.exists("/dev/accel0") or os.path.isdir("/dev/vfio") and bool(
      [d for d in os.listdir("/dev/vfio") if d != "vfio"])


def _multi_worker() -> tf.distribute.Strategy:
  raw = os.environ.get("TF_CONFIG")
  if not raw:
    raise ConfigError(
        "strategy multi_worker needs TF_CONFIG, e.g. "
        '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
        '"task": {"type": "worker", "index": 0}}')
  try:
    tf_config = json.loads(raw)
    tf_config["cluster"]["worker"]
    tf_config["task"]["index"]
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"TF_CONFIG is not a valid cluster spec ({e!r}): {raw}") from None
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=tf.distribute.experimental.CommunicationImplementation.AUTO)
  return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _tpu(tpu: str) -> tf.distribute.Strategy:
  if tpu in _tpu_strategies:
    return _tpu_strategies[tpu]
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    if tpu not in ("", "local"):
      tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, RuntimeError, tf.errors.OpError) as e:
    local = tpu in ("", "local")
    raise ConfigError(
        f"runtime.strategy {'tpu' if local else 'tpu:' + tpu}: could not reach "
        f"{'a TPU on this machine' if local else f'TPU {tpu!r}'} "
        f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'no detail'}). Run it "
        f"on a TPU VM (or name the TPU: tpu:<name>), or use --set runtime.strategy=auto "
        f"(or cpu) to run here.") from None
  strategy = tf.distribute.TPUStrategy(resolver)
  _tpu_strategies[tpu] = strategy
  return strategy


def is_tpu(strategy: tf.distribute.Strategy) -> bool:
  return isinstance(strategy, (tf.distribute.TPUStrategy,))


def device_kind(strategy: tf.distribute.Strategy) -> str:
  """'tpu', 'gpu' or 'cpu': what the replicas run on."""
  if is_tpu(strategy):
    return "tpu"
  devices = getattr(strategy.extended, "worker_devices", ()) or ()
  if any("GPU" in d.upper() for d in devices):
    return "gpu"
  return "cpu"


def is_chief(strategy: Optional[tf.distribute.Strategy] = None) -> bool:
  """True on the worker that writes checkpoints, summaries and logs."""
  strategy = strategy or tf.distribute.get_strategy()
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return True
  task_type, task_id = resolver.task_type, resolver.task_id
  return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0
                                                       and "chief" not in
                                                       resolver.cluster_spec().as_dict())


def worker_names(strategy: tf.distribute.Strategy) -> List[str]:
  """The worker processes running `strategy` in lockstep, e.g. ["worker 0", "worker 1"].

  The chief (if the cluster has one) comes first. One name ("worker 0") unless the
  strategy is a MultiWorkerMirroredStrategy over a cluster from TF_CONFIG.
  """
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return ["worker 0"]
  spec = resolver.cluster_spec().as_dict()
  names = [f"{job} {index}" for job in ("chief", "worker")
           for index in sorted(_task_indices(spec.get(job, ())))]
  return names or ["worker 0"]


def _task_indices(tasks) -> List[int]:
  # A job's tasks are a list of addresses, or {index: address} for a sparse job.
  return [int(i) for i in tasks] if isinstance(tasks, dict) else list(range(len(tasks)))


def worker_name(strategy: tf.distribute.Strategy) -> str:
  """This process's entry of `worker_names`."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if len(worker_names(strategy)) == 1 or resolver is None:
    return worker_names(strategy)[0]
  return f"{resolver.task_type} {int(resolver.task_id or 0)}"


def worker_id(strategy: tf.distribute.Strategy) -> int:
  resolver = getattr(strategy, "cluster_resolver", None)
  return int(getattr(resolver, "task_id", 0) or 0) if resolver else 0
