"""What has to happen before TensorFlow starts: environment defaults and a quiet import.

The process environment may be written only while TensorFlow has not been imported.
Once it is, TensorFlow's thread pools (and oneDNN's, and tf.data's) read variables
with getenv(3) whenever they please, and glibc's setenv/unsetenv -- which every
write to `os.environ` calls -- may move or free the array they are reading: a
known crash class (a segfault seen in this project's test suite). So a setting
that travels by environment variable is set here, before the import, or it goes
to the process that needs it by other means (a child's `env=`, Ray's
`runtime_env`, an argument). `set_defaults_before_tensorflow` refuses to write
once TensorFlow is in the process; tests/conftest.py fails any test that writes.

TensorFlow also prints C++ start-up notices when it is imported (oneDNN is on,
there is no CUDA driver) before absl's logging is set up, so TF_CPP_MIN_LOG_LEVEL
cannot filter them: `import_tensorflow_quietly` imports it with file descriptor 2
captured and replays what is left without those lines.
"""

import contextlib
import glob
import os
import sys
import tempfile
from typing import Dict, Iterator, Mapping, Sequence

# Start-up notices that say nothing about the run; only whole lines containing one are
# dropped (docs/training.md says what each means).
STARTUP_NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on.",  # Informational: oneDNN kernels in use.
)
# The CUDA platform's probe on a machine with no NVIDIA driver: dropped only there.
NO_GPU_NOTICES = (
    "Could not find cuda drivers on your machine, GPU will not be used.",
    "failed call to cuInit:",
)
# Set to 1 to see every start-up line.
SHOW_STARTUP_LOGS = "TPU_MODELS_TF_STARTUP_LOGS"


def tensorflow_started() -> bool:
  """Whether TensorFlow is imported in this process (its threads may be running)."""
  return "tensorflow" in sys.modules


def set_defaults_before_tensorflow(values: Mapping[str, str]) -> Dict[str, str]:
  """Sets each of `values` in os.environ that is not set already, if TensorFlow is not
  imported yet; once it is, writes nothing (see the module docstring). Returns what it set.
  """
  if tensorflow_started():
    return {}
  missing = {name: value for name, value in values.items() if name not in os.environ}
  os.environ.update(missing)
  return missing


@contextlib.contextmanager
def environ_kept_in_python(**values: str) -> Iterator[Dict[str, str]]:
  """A block in which `os.environ` is a plain dict: a copy of the environment with `values`.

  For code that writes os.environ once TensorFlow runs (tf2onnx sets TF_CPP_MIN_LOG_LEVEL
  when imported and on every conversion; the tests' in-process CLI runs): Python code in
  the block reads and writes the dict, the process environment -- what TensorFlow's
  threads read with getenv(3) -- is never written. On exit `os.environ` is the real
  mapping again, unchanged. A child started in the block sees the dict only if it is
  given `env=os.environ`.
  """
  real = os.environ
  os.environ = dict(real, **values)
  try:
    yield os.environ
  finally:
    os.environ = real


def has_nvidia_device() -> bool:
  """Whether this machine has an NVIDIA device node or driver (then CUDA notices matter)."""
  return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/proc/driver/nvidia")


def without_notices(stderr: bytes, notices: Sequence[str]) -> bytes:
  """`stderr` without the whole lines that contain one of `notices` (str)."""
  return b"".join(line for line in stderr.splitlines(keepends=True)
                  if not any(notice.encode() in line for notice in notices))


def import_tensorflow_quietly() -> None:
  """Imports TensorFlow and probes for GPUs with stderr (fd 2) captured, then replays it
  without the start-up notices. Does nothing when TensorFlow is imported already or
  $TPU_MODELS_TF_STARTUP_LOGS is 1."""
  if tensorflow_started() or os.environ.get(SHOW_STARTUP_LOGS) == "1":
    return
  notices = STARTUP_NOTICES + (() if has_nvidia_device() else NO_GPU_NOTICES)
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.config.list_physical_devices("GPU")  # Where the CUDA probe (cuInit) logs.
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = without_notices(captured.read(), notices)
      if kept:
        os.write(2, kept)
