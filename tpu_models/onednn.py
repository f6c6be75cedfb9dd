"""oneDNN for TensorFlow's CPU kernels: whether it runs, and the CLI's default of on.

TensorFlow turns oneDNN on by default only on x86 CPUs with AVX-512 VNNI/BF16 or
AMX; on the others (an AVX2-only AMD EPYC here) it runs its own Eigen kernels
unless TF_ENABLE_ONEDNN_OPTS=1. There oneDNN trained every official recipe
measured faster in float32, 1.09-1.54x per step (benchmarks/README.md, "oneDNN on
an AVX2-only CPU"), so `tpu-models` sets TF_ENABLE_ONEDNN_OPTS=1 on x86-64 unless
it is set already. Where TensorFlow turns oneDNN on anyway that changes nothing.

TensorFlow reads the variable once, when it is imported, so it has to be set
before that: the CLI calls `default_on()` first thing. A script that imports
TensorFlow itself keeps TensorFlow's own choice unless it sets the variable
first; `enabled()` says what the process got. Nothing here imports TensorFlow
at module level.

Not with one thread: on the AVX2-only EPYC, TensorFlow 2.21 with oneDNN forced on
and one intra-op thread corrupted its heap within a few steps of a convolutional
network's training ("free(): invalid pointer", "malloc_consolidate(): invalid
chunk size"; two threads ran clean; docs/reliability.md, row 36). So the default
needs `MIN_THREADS` usable CPUs. The sweep driver runs no TensorFlow work itself:
the CLI leaves its environment alone and the driver gives its trial processes
`child_environ(cpus)`, so trials of one CPU each get TensorFlow's own choice.
"""

import os
import platform
from typing import Dict, Mapping, MutableMapping, Optional

from tpu_models import startup

ENV = "TF_ENABLE_ONEDNN_OPTS"
MIN_THREADS = 2
_X86_64 = ("x86_64", "amd64")


def usable_cpus() -> int:
  """The CPUs this process may run on (its affinity mask where the OS has one)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def default_on(environ: Optional[MutableMapping[str, str]] = None,
               machine: Optional[str] = None, cpus: Optional[int] = None) -> bool:
  """Sets TF_ENABLE_ONEDNN_OPTS=1 in `environ` (os.environ) on an x86-64 machine.

  Leaves it alone when it is set already (the user's choice, "0" included),
  when TensorFlow is imported (too late to matter, and unsafe: startup.py), on
  other machines (`machine`, platform.machine() when None) and with fewer than
  MIN_THREADS CPUs (`cpus`, usable_cpus() when None). Returns whether it set it.
  """
  if startup.tensorflow_started():
    return False
  wanted = child_environ(usable_cpus() if cpus is None else cpus, machine,
                         user_environ=os.environ if environ is None else environ)
  if environ is None:
    startup.set_defaults_before_tensorflow(wanted)
  else:
    environ.update(wanted)
  return bool(wanted)


def child_environ(cpus: int, machine: Optional[str] = None,
                  user_environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
  """The oneDNN default for a process that will run TensorFlow on `cpus` CPUs (a sweep
  trial): {TF_ENABLE_ONEDNN_OPTS: "1"} on x86-64 with at least MIN_THREADS CPUs, unless
  `user_environ` (os.environ) sets it already -- the child inherits the user's value then
  -- else {} (TensorFlow's own choice)."""
  user_environ = os.environ if user_environ is None else user_environ
  machine = (platform.machine() if machine is None else machine).lower()
  if ENV in user_environ or machine not in _X86_64 or cpus < MIN_THREADS:
    return {}
  return {ENV: "1"}


def enabled() -> bool:
  """Whether TensorFlow runs its CPU kernels through oneDNN in this process."""
  try:
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
  except ImportError:  # A TensorFlow without the probe: assume oneDNN.
    return True
  return bool(_pywrap_util_port.IsMklEnabled())
