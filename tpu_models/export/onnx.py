"""ONNX exporter: `tf2onnx` (the `deploy` extra), each file checked by loading it in onnxruntime.

tf2onnx writes `os.environ` (TF_CPP_MIN_LOG_LEVEL) when imported and on every
conversion: both happen inside `startup.environ_kept_in_python()`, which keeps the
write in Python's copy (no putenv while TensorFlow's threads run).
"""

import os
from typing import Any, Dict, Mapping, Sequence

import tensorflow as tf

from tpu_models import startup
from tpu_models.errors import ConfigError, MissingExtraError
from tpu_models.export import freezing
from tpu_models.export.record import INSTALL_DEPLOY
from tpu_models.task import DeployFunction

ONNX_OPSET = 17


def require_tf2onnx():
  try:
    with startup.environ_kept_in_python():  # It sets TF_CPP_MIN_LOG_LEVEL when imported.
      import tf2onnx  # pylint: disable=g-import-not-at-top
      import tf2onnx.convert  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise MissingExtraError(f"--format onnx needs tf2onnx and onnxruntime: {INSTALL_DEPLOY} "
                            f"(or pip install tf2onnx onnxruntime).") from None
  return tf2onnx


def _onnx_file(name: str, names: Sequence[str]) -> str:
  return "model.onnx" if len(names) == 1 else f"{name}.onnx"


def write_onnx(functions: Mapping[str, DeployFunction], frozen: Mapping[str, Any],
                directory: str, say) -> Dict[str, Any]:
  """One ONNX model per signature (tf2onnx), each loaded once in onnxruntime as a check."""
  tf2onnx = require_tf2onnx()
  files = {}
  for name, fn in sorted(functions.items()):
    path = os.path.join(directory, _onnx_file(name, list(functions)))
    function = freezing.graph_callable(fn, frozen[name], integer_io=True)
    try:
      # tf2onnx sets TF_CPP_MIN_LOG_LEVEL on every conversion: Python's copy only (startup.py).
      with startup.environ_kept_in_python():
        tf2onnx.convert.from_function(function, input_signature=function.input_signature,
                                      opset=ONNX_OPSET, output_path=path)
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f"tf2onnx cannot convert signature {name!r}: {str(e).splitlines()[0]}. "
                        f"Export --format litert or saved_model instead.") from None
    files[name] = os.path.basename(path)
  record = {"files": files, "opset": ONNX_OPSET,
            "converter": f"tf2onnx {tf2onnx.__version__} (TensorFlow {tf.__version__})"}
  try:
    import onnxruntime  # pylint: disable=g-import-not-at-top
  except ImportError:
    say(f"onnxruntime is not installed: the ONNX files were not loaded as a check "
        f"({INSTALL_DEPLOY}).")
    return record
  for name, file in files.items():
    onnxruntime.InferenceSession(os.path.join(directory, file),
                                 providers=["CPUExecutionProvider"])
  record["checked_with"] = f"onnxruntime {onnxruntime.__version__}"
  return record
