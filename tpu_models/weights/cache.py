"""Catalogue entries in one call: fetch (verified), import, and cache the model_dir.

    model_dir = get("ENTRY")   # a `tpu-models weights list` name; second call: instant
    create_model(entry.model, weights="ENTRY", **entry.params)

The cache (TPU_MODELS_HOME, default ~/.cache/tpu_models) holds
`downloads/<file>` (each with `<file>.verified.json`: its SHA-256, size and
what it was checked against) and `models/<entry>/` (the imported model_dir:
ckpt-0, config.yaml, weights_import.json). An entry's model_dir is written
under a temporary name and renamed into place, under the entry's lock.
"""

import os
import shutil
from typing import Callable, Dict, Iterable, List, Optional

from tpu_models.errors import ConfigError
from tpu_models.weights import catalogue
from tpu_models.weights import fetch


def models_dir(environ=None) -> str:
  return os.path.join(fetch.home(environ), "models")


model_dir_of = fetch.model_dir_of


def is_cached(name: str, environ=None) -> bool:
  """Whether `name`'s imported model_dir is in the cache."""
  return os.path.exists(os.path.join(model_dir_of(name, environ), "config.yaml"))


def downloaded_path(entry: catalogue.WeightsEntry, environ=None) -> Optional[str]:
  """The verified downloaded file of `entry` in the cache, or None."""
  if entry.remote is None:
    return None
  path = os.path.join(fetch.downloads_dir(environ), entry.remote.file_name)
  return path if os.path.exists(path) and fetch.read_record(path) else None


def get(name: str, *, environ=None, trust_unverified: bool = False,
        overrides: Iterable[str] = (), say: Callable[[str], None] = print,
        stats: Optional[Dict[str, object]] = None) -> str:
  """The cached model_dir of catalogue entry `name`: fetched, verified and imported when missing.

  Args:
    name: a catalogue entry (`tpu-models weights list`).
    environ: the environment read (default os.environ; never written).
    trust_unverified: accept a download no SHA-256 is published for (recorded).
    overrides: config overrides applied to the imported model_dir's config.yaml.
    say: where progress lines go.
    stats: filled as `fetch.fetch_file` fills it, plus "imported" (True: imported now).

  Returns:
    The model_dir: `create_model(entry.model, weights=model_dir, **entry.params)`,
    `tpu-models evaluate MODEL_DIR/config.yaml --model-dir MODEL_DIR`.
  """
  stats = {} if stats is None else stats
  entry = catalogue.get_weights(name)
  if entry.refused:
    raise ConfigError(f"{entry.name} cannot be imported: {entry.refused}")
  target = model_dir_of(entry.name, environ)
  stats["imported"] = False
  if is_cached(entry.name, environ):
    stats.setdefault("transferred", 0)
    stats["cached"] = True
    return target
  if entry.remote is None or not entry.remote.url:
    why = entry.remote.published if entry.remote else "none recorded"
    raise fetch.WeightsDownloadError(
        f"{entry.name}: no public download location ({why}); download it as "
        f"{entry.download} says and run `tpu-models weights import {entry.name} FILE "
        f"--output DIR`.")
  path = fetch.fetch_file(entry.remote, label=entry.name, environ=environ,
                          trust_unverified=trust_unverified, say=say, stats=stats)
  from tpu_models.weights import importing  # Imports TensorFlow: only now.
  with fetch.locked(target + ".lock", say, entry.name):
    if is_cached(entry.name, environ):
      return target
    temporary = target + ".importing"
    shutil.rmtree(temporary, ignore_errors=True)
    importing.import_weights(entry.name, fetch.weights_path(entry.remote, path), temporary,
                             overrides=overrides,
                             say=lambda line: say(line.replace(temporary, target)))
    os.replace(temporary, target)
    stats["imported"] = True
  return target


def resolve_weights(weights: str, environ=None, say: Callable[[str], None] = print) -> str:
  """`create_model(..., weights=W)`: W itself when it is a directory, else the model_dir of
  the catalogue entry named W (fetched when missing)."""
  if os.path.isdir(weights):
    return weights
  if os.sep in weights or weights.startswith("."):
    raise ConfigError(f"weights={weights!r} is neither a model_dir nor a catalogue entry name.")
  return get(weights, environ=environ, say=say)


def resolve_init_checkpoint(config, environ=None, say: Callable[[str], None] = print):
  """`config` with a catalogue entry name in `trainer.init_checkpoint` replaced by the entry's
  cached model_dir (fetched and imported when missing); any other value unchanged."""
  import dataclasses
  name = config.trainer.init_checkpoint
  if not name or os.sep in name or os.path.exists(name):
    return config
  catalogue.load_families()
  if name not in catalogue.WEIGHTS:
    return config
  model_dir = get(name, environ=environ, say=say)
  say(f"trainer.init_checkpoint: {name} -> {model_dir}")
  return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer,
                                                                 init_checkpoint=model_dir))


def cached_entries(environ=None) -> List[Dict[str, object]]:
  """What the cache holds: every model_dir and download, with sizes."""
  rows = []
  for kind, directory in (("model_dir", models_dir(environ)),
                          ("download", fetch.downloads_dir(environ))):
    if not os.path.isdir(directory):
      continue
    for item in sorted(os.listdir(directory)):
      path = os.path.join(directory, item)
      if item.endswith((".lock", ".part", ".verified.json", ".importing", ".tmp")):
        continue
      if kind == "download" and item.endswith(".extracted"):
        continue
      size = (sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
              if os.path.isdir(path) else os.path.getsize(path))
      rows.append({"kind": kind, "name": item, "path": path, "bytes": size,
                   "record": fetch.read_record(path) if kind == "download" else None})
  return rows


def clear(name: str, environ=None) -> List[str]:
  """Removes entry `name`'s model_dir and download from the cache; returns what was removed."""
  entry = catalogue.get_weights(name)
  removed = []
  paths = [model_dir_of(entry.name, environ)]
  if entry.remote is not None and entry.remote.url:
    download = os.path.join(fetch.downloads_dir(environ), entry.remote.file_name)
    paths += [download, fetch.record_path(download), download + ".part",
              download + ".extracted"]
  for path in paths:
    if os.path.isdir(path):
      shutil.rmtree(path)
      removed.append(path)
    elif os.path.exists(path):
      os.remove(path)
      removed.append(path)
  return removed
