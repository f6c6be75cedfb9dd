"""Running an export through its own runtime: one callable per format, (signature, inputs) -> outputs.

SavedModel in TensorFlow, LiteRT in ai_edge_litert (tf.lite for Select-TF ops), ONNX
in onnxruntime. Each model file is checked against the sha256 `export.json` recorded
before it is loaded: a damaged file is one line (a DataError), not a crash.
"""

import contextlib
import os
from typing import Dict, List, Mapping, Optional

import numpy as np
import tensorflow as tf

from tpu_models.errors import ConfigError, DataError, MissingExtraError
from tpu_models.export import litert
from tpu_models.export.record import FORMATS, INSTALL_DEPLOY, read_export, sha256


class NoRuntimeError(ConfigError):
  """This Python has no runtime able to run an export (e.g. its Select-TF ops)."""



class ExportRunner:
  """Runs an export through its own runtime: `runner(signature, inputs) -> outputs`.

  Inputs are {name: numpy array} as `export.json` describes them (integer inputs as
  uint8; an int8 model's quantized inputs are quantized here by their recorded scale
  and zero point); outputs are {name: numpy array}. A wrong shape or dtype is an
  error: LiteRT, whose runner would resize any input, a ValueError from the check
  here (`litert.feed`) or the interpreter's; onnxruntime its InvalidArgument error;
  SavedModel its InvalidArgumentError.

  Attributes:
    format: the export's format.
    runtime: what runs it, e.g. "ai_edge_litert 2.3.0".
  """

  def __init__(self, path: str, threads: Optional[int] = None):
    self.path = path
    self.record = read_export(path)
    self.format = self.record["format"]
    if self.format == "saved_model":
      for name in self.record.get("sha256", {}):  # Recorded since issue 48; older: none.
        self._checked_file(name, "SavedModel")
      self._model = self._load_saved_model(path)
      self.runtime = f"TensorFlow {tf.__version__}"
    elif self.format in ("litert", "litert-int8"):
      select_tf = bool(self.record.get("select_tf_ops"))
      file = self._checked_file(self.record["file"], "LiteRT")
      with self._loading(file, "LiteRT"):
        self._interpreter = litert.make_interpreter(file, threads=threads, select_tf=select_tf)
      self.runtime = litert.litert_runtime_label(select_tf)
      self._runners = {}
    elif self.format == "onnx":
      try:
        import onnxruntime  # pylint: disable=g-import-not-at-top
      except ImportError:
        raise MissingExtraError(f"Running an ONNX export needs onnxruntime: "
                                f"{INSTALL_DEPLOY}.") from None
      options = onnxruntime.SessionOptions()
      if threads:
        options.intra_op_num_threads = threads
      self._sessions = {}
      for name, file in self.record["files"].items():
        file = self._checked_file(file, "ONNX")
        with self._loading(file, "ONNX"):
          self._sessions[name] = onnxruntime.InferenceSession(
              file, options, providers=["CPUExecutionProvider"])
      self.runtime = f"onnxruntime {onnxruntime.__version__}"
    else:
      raise ConfigError(f"{path}: export.json names format {self.format!r}; expected one of "
                        f"{', '.join(FORMATS)}.")

  def _checked_file(self, name: str, kind: str) -> str:
    """The path of the export's file `name`; a DataError (one line) when it is missing,
    empty, or its sha256 is not the one export.json recorded (damaged after export), or
    when `name` leads out of the export's folder (a record edited or not ours)."""
    again = "export it again (tpu-models export ... --overwrite)"
    if (not isinstance(name, str) or os.path.isabs(name) or
        os.path.normpath(name).split(os.sep)[0] == os.pardir):
      raise DataError(f"{self.path}: export.json names the {kind} file {name!r}, which is "
                      f"outside the export's folder; refused (an export's files are inside it). "
                      f"{again[0].upper()}{again[1:]}.")
    path = os.path.join(self.path, name)
    if not os.path.isfile(path):
      raise DataError(f"{path} is missing: export.json names it as the {kind} model; {again}.")
    if not os.path.getsize(path):
      raise DataError(f"{path} is empty (0 bytes), not a {kind} model: cut short by a full "
                      f"disk or a copy; {again}.")
    recorded = self.record.get("sha256", {}).get(name)
    if recorded and sha256(path) != recorded:
      raise DataError(f"{path} is damaged: its sha256 is not the one export.json recorded "
                      f"when it was written ({os.path.getsize(path)} bytes now); {again}.")
    return path

  @staticmethod
  def _load_saved_model(path: str):
    """tf.saved_model.load, its refusal of a damaged file one line naming the file (for
    exports without recorded sha256s, or damage the digests cannot see)."""
    try:
      return tf.saved_model.load(path)
    except (OSError, ValueError, tf.errors.OpError) as e:
      text = " ".join(str(e).split())
      # saved_model.pb that does not parse: "Cannot parse file b'…/saved_model.pb'"; a
      # variables file: "TensorBundle at …/variables/variables shard 0 …: Checksum …".
      file = (os.path.join(path, "saved_model.pb") if "saved_model.pb" in text else
              os.path.join(path, "variables") + os.sep if "variables" in text else path)
      raise DataError(f"{file} is not readable as part of a SavedModel ({type(e).__name__}: "
                      f"{text[:300]}); export it again (tpu-models export ... "
                      f"--overwrite).") from None

  @contextlib.contextmanager
  def _loading(self, path: str, kind: str):
    """Turns the runtime's refusal of a file into one line (exports without a sha256)."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      # ai_edge_litert: ValueError "... not a valid Flatbuffer buffer"; onnxruntime:
      # InvalidProtobuf, Fail, ... (its own exception classes).
      why = " ".join(str(e).split())[:300] or type(e).__name__
      raise DataError(f"{path} is not a readable {kind} model ({type(e).__name__}: {why}); "
                      f"export it again (tpu-models export ... --overwrite).") from None

  def signatures(self) -> List[str]:
    if self.format == "saved_model":
      return sorted(self._model.signatures.keys())
    if self.format == "onnx":
      return sorted(self._sessions)
    return sorted(self._interpreter.get_signature_list())

  def __call__(self, signature: str, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    if signature not in self.signatures():
      raise ConfigError(f"{self.path} ({self.format}) has no signature {signature!r}; it has "
                        f"{', '.join(self.signatures())}.")
    if self.format == "saved_model":
      outputs = self._model.signatures[signature](
          **{key: tf.constant(value) for key, value in inputs.items()})
      return {key: value.numpy() for key, value in outputs.items()}
    if self.format == "onnx":
      session = self._sessions[signature]
      names = [output.name for output in session.get_outputs()]
      return dict(zip(names, session.run(names, dict(inputs))))
    runner = self._runners.get(signature)
    if runner is None:
      runner = self._runners[signature] = self._interpreter.get_signature_runner(signature)
    feed = litert.feed(signature, runner.get_input_details(), inputs)
    try:
      return runner(**feed)
    except RuntimeError as e:
      if "Flex delegate" not in str(e):
        raise
      raise NoRuntimeError(
          f"{self.path} holds Select-TF ops ({', '.join(self.record['select_tf_ops'])}), "
          f"which this Python's LiteRT interpreter ({self.runtime}) cannot run (no Flex "
          f"delegate linked); run it where one is (Android: tensorflow-lite-select-tf-ops) "
          f"or export without those ops.") from None
