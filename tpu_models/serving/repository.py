"""MODEL_BASE: numbered versions of one model, TF Serving's layout, and writing the next one.

    MODEL_BASE/1/            an export of `tpu-models export` (any format)
    MODEL_BASE/2/
    MODEL_BASE/serving.yaml  optional: labels and the default version (below)

A directory whose name is not a number (e.g. `.incoming-PID-...`, a version being
written) is not a version. A MODEL_BASE that is itself an export (its `export.json`
at the top or in `assets.extra/`) is served as version 1.

A version is served only when it validates (`check_version`): its `export.json` reads
as an object naming a known format, the files that format needs are there and not
empty, and every file the record's `sha256` names has that sha256. Versions written
by `--to` (`publish`) record the sha256 of every file of the export; a version copied
in by hand without a record is checked for its files only.

`serving.yaml` (re-read at every poll; a broken one is one logged line and the last
good one stays):

    default: latest        # what a request naming no version gets: latest (the newest
                           # valid version, the default), a version number, or a label
    labels:                # /v1/models/NAME/labels/stable:predict
      stable: 3
      canary: 4

The versions kept loaded are the newest valid one, every labelled one and the default.
Rollback is `stable: <the previous number>` (and `default: stable` to make unnamed
requests follow it).

No TensorFlow and no Ray here: `export --to` and the sweep import it too.
"""

import ctypes
import dataclasses
import errno
import json
import os
import re
import secrets
from typing import Any, Callable, Dict, List, Optional, Tuple

from tpu_models.errors import DataError
from tpu_models.export.record import (EXPORT_JSON, FORMATS, parse_record, read_export,
                                      record_path, sha256)

CONFIG_FILE = "serving.yaml"
_INCOMING = ".incoming-"  # Where `publish` writes a version before it gets its number.
_VERSION_NAME = re.compile(r"^[0-9]{1,18}$")


class DamagedVersion(ValueError):
  """A version that must not be served: the message is one line naming it and why."""


@dataclasses.dataclass(frozen=True)
class ServingConfig:
  """What `serving.yaml` says: the default version (None = the newest) and labels.

  Attributes:
    default: "latest", a version number (int) or a label name.
    labels: {label: version number}.
  """
  default: Any = "latest"
  labels: Dict[str, int] = dataclasses.field(default_factory=dict)

  def wanted(self) -> List[int]:
    """The version numbers this config names (labels and a numbered default)."""
    numbers = set(self.labels.values())
    if isinstance(self.default, int):
      numbers.add(self.default)
    return sorted(numbers)


def is_export(path: str) -> bool:
  """Whether `path` holds an export's record (at the top, or a SavedModel's assets.extra/)."""
  return record_path(path) is not None


def version_paths(model_base: str) -> Dict[int, str]:
  """{version number: directory} of `model_base` (an export itself is {1: model_base}).

  Raises:
    FileNotFoundError: `model_base` is not a directory.
  """
  if not os.path.isdir(model_base):
    raise FileNotFoundError(f"MODEL_BASE {model_base!r} is not a directory: pass a directory of "
                            f"numbered versions (MODEL_BASE/1/, MODEL_BASE/2/, ...) or one "
                            f"export directory.")
  if is_export(model_base):
    return {1: model_base}
  versions = {}
  for name in os.listdir(model_base):
    path = os.path.join(model_base, name)
    if _VERSION_NAME.match(name) and os.path.isdir(path):
      versions[int(name)] = path
  return versions


def fingerprint(path: str) -> Tuple[Tuple[str, int, int], ...]:
  """(relative path, size, mtime in ns) of every file under `path`: changes when any does.

  Cheap (no file is read): the poller checks a refused version again only when this
  changes, e.g. once a copy by hand has finished.
  """
  entries = []
  for folder, _, names in os.walk(path):
    for name in names:
      full = os.path.join(folder, name)
      try:
        stat = os.stat(full)
      except OSError:  # Removed while listed.
        continue
      entries.append((os.path.relpath(full, path), stat.st_size, stat.st_mtime_ns))
  return tuple(sorted(entries))


def read_record(path: str) -> Dict[str, Any]:
  """The `export.json` of the export at `path`; a DamagedVersion when missing or unreadable."""
  try:
    return read_export(path)
  except FileNotFoundError:
    raise DamagedVersion(f"{path} has no {EXPORT_JSON} (incomplete, or not written by "
                         f"tpu-models export)") from None
  except DataError as e:
    raise DamagedVersion(str(e)) from None


def check_version(path: str) -> Dict[str, Any]:
  """The record of the export at `path` once its files check out, else a DamagedVersion.

  Checks: a readable export.json naming a known format; the files that format needs
  (saved_model.pb and the variables, model.tflite, the .onnx files) are there and not
  empty; every file in the record's `sha256` has that sha256.
  """
  record = read_record(path)
  format_name = record["format"]
  if format_name not in FORMATS:
    raise DamagedVersion(f"{path}: export.json names format {format_name!r}; expected one of "
                         f"{', '.join(FORMATS)}")
  if format_name == "saved_model":
    needed = ["saved_model.pb"]
    if os.path.isdir(os.path.join(path, "variables")) or "sha256" not in record:
      needed.append(os.path.join("variables", "variables.index"))
  elif format_name == "onnx":
    needed = sorted(record.get("files", {}).values()) or ["model.onnx"]
  else:
    needed = [record.get("file", "model.tflite")]
  for name in needed:
    full = os.path.join(path, name)
    if not os.path.isfile(full):
      raise DamagedVersion(f"{full} is missing (incomplete export)")
    if not os.path.getsize(full):
      raise DamagedVersion(f"{full} is empty (0 bytes)")
  recorded = record.get("sha256") or {}
  if not isinstance(recorded, dict):
    raise DamagedVersion(f"{path}: export.json's sha256 is a {type(recorded).__name__}, not "
                         f"{{file: sha256}}")
  for name, digest in sorted(recorded.items()):
    full = os.path.join(path, name)
    if not _inside(path, full):
      raise DamagedVersion(f"{path}: export.json's sha256 names {name!r}, outside the export")
    if not os.path.isfile(full):
      raise DamagedVersion(f"{full} is missing (export.json records its sha256)")
    if sha256(full) != digest:
      raise DamagedVersion(f"{full} is damaged: its sha256 is not the one export.json "
                           f"recorded ({os.path.getsize(full)} bytes now)")
  return record


def read_config(model_base: str) -> ServingConfig:
  """MODEL_BASE/serving.yaml as a ServingConfig (the defaults when there is none).

  Raises:
    ValueError: the file is not valid YAML of that form (one line saying what is wrong).
  """
  path = os.path.join(model_base, CONFIG_FILE)
  if not os.path.isfile(path):
    return ServingConfig()
  import yaml  # pylint: disable=g-import-not-at-top
  try:
    with open(path, encoding="utf-8") as f:
      data = yaml.safe_load(f) or {}
  except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not readable YAML ({_one_line(e)})") from None
  expected = ("expected {default: latest | VERSION | LABEL, labels: {LABEL: VERSION, ...}}")
  if not isinstance(data, dict) or set(data) - {"default", "labels"}:
    raise ValueError(f"{path}: {expected}; got {_one_line(data)}")
  labels = data.get("labels") or {}
  if not isinstance(labels, dict):
    raise ValueError(f"{path}: labels must be a mapping LABEL: VERSION; got {_one_line(labels)}")
  for label, version in labels.items():
    if not isinstance(label, str) or not re.match(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$", label):
      raise ValueError(f"{path}: label {label!r} is not a name (a letter, then letters, digits, "
                       f"_ . -)")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
      raise ValueError(f"{path}: label {label!r} must name a version number; got {version!r}")
  default = data.get("default", "latest")
  if isinstance(default, bool) or not (
      (isinstance(default, int) and default >= 0) or default == "latest" or default in labels):
    raise ValueError(f"{path}: default must be latest, a version number or one of the labels "
                     f"({', '.join(sorted(labels)) or 'none defined'}); got {default!r}")
  return ServingConfig(default=default, labels=dict(labels))


def publish(model_base: str, write: Callable[[str], Any],
            say: Optional[Callable[[str], None]] = None) -> Tuple[int, str]:
  """Writes an export as the next version of `model_base`; returns (version, its directory).

  `write(path)` writes the export at `path` (a directory that does not exist yet,
  `MODEL_BASE/.incoming-PID-RANDOM`, not a version to the server's poller). Then the
  sha256 of every file goes into its export.json, and the directory is renamed to
  `MODEL_BASE/N`, N one above the highest version there. The rename never replaces a
  directory (Linux `renameat2(RENAME_NOREPLACE)`; elsewhere a rename onto a non-empty
  directory fails the same way), so two writers never get the same N: the loser takes
  the next number. A failed `write` leaves no version and removes its directory.
  """
  say = say or (lambda text: None)
  os.makedirs(model_base, exist_ok=True)
  if is_export(model_base):
    raise ValueError(f"--to {model_base!r} is an export itself, not a directory of numbered "
                     f"versions; pass its parent or a new directory.")
  _remove_abandoned(model_base, say)
  incoming = os.path.join(model_base, f"{_INCOMING}{os.getpid()}-{secrets.token_hex(4)}")
  try:
    write(incoming)
    record_checksums(incoming)
    while True:
      version = max(version_paths(model_base), default=0) + 1
      target = os.path.join(model_base, str(version))
      if _rename_no_replace(incoming, target):
        break  # Else another writer took `version` between the listing and the rename.
  finally:
    if os.path.exists(incoming):
      import shutil  # pylint: disable=g-import-not-at-top
      shutil.rmtree(incoming, ignore_errors=True)
  say(f"Version {version} of {model_base} is in place: {target}.")
  return version, target


def record_checksums(path: str) -> None:
  """Adds the sha256 of every file of the export at `path` (but export.json) to its record."""
  record_file = record_path(path)
  record = parse_record(record_file)
  checksums = dict(record.get("sha256") or {})
  for folder, _, names in os.walk(path):
    for name in names:
      full = os.path.join(folder, name)
      if full != record_file:
        checksums[os.path.relpath(full, path)] = sha256(full)
  record["sha256"] = dict(sorted(checksums.items()))
  tmp = f"{record_file}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
  os.replace(tmp, record_file)


def _rename_no_replace(source: str, target: str) -> bool:
  """Renames directory `source` to `target` unless `target` exists; False when it does."""
  try:
    renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
  except (OSError, AttributeError):  # Not Linux, or a C library without it.
    renameat2 = None
  if renameat2 is not None:
    at_fdcwd, rename_noreplace = -100, 1
    if renameat2(at_fdcwd, os.fsencode(source), at_fdcwd, os.fsencode(target),
                 rename_noreplace) == 0:
      return True
    error = ctypes.get_errno()
    if error == errno.EEXIST:
      return False
    if error not in (errno.EINVAL, errno.ENOSYS):  # Else: the filesystem lacks the flag.
      raise OSError(error, os.strerror(error), target)
  if os.path.exists(target):
    return False
  try:
    os.rename(source, target)  # Fails onto a non-empty directory: every export has files.
  except OSError as e:
    if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
      return False
    raise
  return True


def _remove_abandoned(model_base: str, say: Callable[[str], None]) -> None:
  """Removes `.incoming-PID-*` directories of writers whose process no longer runs."""
  import shutil  # pylint: disable=g-import-not-at-top
  for name in os.listdir(model_base):
    match = re.match(rf"^{re.escape(_INCOMING)}(\d+)-", name)
    if not match or _process_runs(int(match[1])):
      continue
    shutil.rmtree(os.path.join(model_base, name), ignore_errors=True)
    say(f"Removed {os.path.join(model_base, name)}, left by a writer (pid {match[1]}) that no "
        f"longer runs.")


def _process_runs(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _inside(root: str, path: str) -> bool:
  root = os.path.realpath(root)
  return os.path.commonpath([root, os.path.realpath(path)]) == root


def _one_line(value: Any) -> str:
  return " ".join(str(value).split())[:200]
