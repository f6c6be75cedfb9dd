"""What an export directory holds and how it is read back: formats, export.json, config.yaml.

A SavedModel keeps its record and config in `assets.extra/`; the other formats beside
their model files. `export.json` records each model file's sha256, which the runtime
checks before loading (`runtime.ExportRunner`).
"""

import hashlib
import json
import os
from typing import Any, Dict, Mapping

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


def read_export(path: str) -> Dict[str, Any]:
  """The `export.json` of an export directory (a SavedModel's is in assets.extra/)."""
  for candidate in (os.path.join(path, EXPORT_JSON),
                    os.path.join(path, "assets.extra", EXPORT_JSON)):
    if os.path.exists(candidate):
      try:
        with open(candidate, encoding="utf-8") as f:
          record = json.load(f)
      except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{candidate} is not valid JSON ({e}): the export's record is "
                        f"damaged; export it again (tpu-models export ... --overwrite).") from None
      if not isinstance(record, dict):
        raise DataError(f"{candidate} holds a JSON {type(record).__name__}, not the export's "
                        f"record (an object); export it again.")
      record.setdefault("format", "saved_model")
      return record
  raise FileNotFoundError(f"{path!r} is not an export (no {EXPORT_JSON}): write one with "
                          f"tpu-models export CONFIG --model-dir D --output {path}.")


def export_config_path(path: str) -> str:
  """The experiment config stored in an export directory."""
  for candidate in (os.path.join(path, CONFIG_FILE),
                    os.path.join(path, "assets.extra", CONFIG_FILE)):
    if os.path.exists(candidate):
      return candidate
  raise FileNotFoundError(f"{path!r} holds no {CONFIG_FILE}; pass --config.")
