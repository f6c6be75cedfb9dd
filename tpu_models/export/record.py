"""What an export directory holds and how it is read back: formats, export.json, config.yaml.

A SavedModel keeps its record and config in `assets.extra/`; the other formats beside
their model files. `export.json` records each model file's sha256, which the runtime
checks before loading (`runtime.ExportRunner`).
"""

import hashlib
import json
import os
from typing import Any, Dict, Mapping, Optional

from tpu_models.errors import ConfigError, DataError

FORMATS = ("saved_model", "litert", "litert-int8", "onnx")
EXPORT_JSON = "export.json"
CONFIG_FILE = "config.yaml"
INSTALL_DEPLOY = "pip install 'tpu-models[deploy]'"


def check_format(format_name: str) -> None:
  """A ConfigError unless `format_name` is one of FORMATS."""
  if format_name not in FORMATS:
    raise ConfigError(f"--format {format_name!r} is not an export format; expected one of "
                      f"{', '.join(FORMATS)}.")


def sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def write_record(directory: str, record: Mapping[str, Any]) -> None:
  with open(os.path.join(directory, EXPORT_JSON), "w") as f:
    json.dump(record, f, indent=1)


def record_path(path: str) -> Optional[str]:
  """Where the `export.json` of the export at `path` is (a SavedModel's is in assets.extra/),
  or None when there is none."""
  for candidate in (os.path.join(path, EXPORT_JSON),
                    os.path.join(path, "assets.extra", EXPORT_JSON)):
    if os.path.isfile(candidate):
      return candidate
  return None


def parse_record(candidate: str) -> Dict[str, Any]:
  """The record in the `export.json` file `candidate`, its format defaulted to saved_model.

  Raises:
    DataError: the file cannot be read, is not JSON, or holds no JSON object (one line
      naming the file).
  """
  try:
    with open(candidate, encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError, UnicodeDecodeError) as e:
    reason = " ".join(str(e).split())
    raise DataError(f"{candidate} is not readable JSON ({reason})") from None
  if not isinstance(record, dict):
    raise DataError(f"{candidate} holds a JSON {type(record).__name__}, not an export's "
                    f"record (an object)")
  record.setdefault("format", "saved_model")
  return record


def read_export(path: str) -> Dict[str, Any]:
  """The `export.json` of an export directory (a SavedModel's is in assets.extra/)."""
  candidate = record_path(path)
  if candidate is None:
    raise FileNotFoundError(f"{path!r} is not an export (no {EXPORT_JSON}): write one with "
                            f"tpu-models export CONFIG --model-dir D --output {path}.")
  try:
    return parse_record(candidate)
  except DataError as e:
    raise DataError(f"{e}: the export's record is damaged; export it again "
                    f"(tpu-models export ... --overwrite).") from None


def export_config_path(path: str) -> str:
  """The experiment config stored in an export directory."""
  for candidate in (os.path.join(path, CONFIG_FILE),
                    os.path.join(path, "assets.extra", CONFIG_FILE)):
    if os.path.exists(candidate):
      return candidate
  raise FileNotFoundError(f"{path!r} holds no {CONFIG_FILE}; pass --config.")
