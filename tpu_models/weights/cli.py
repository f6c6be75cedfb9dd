"""`tpu-models weights list|import` and `tpu-models migrate model-garden`.

Light at import time (the CLI builds its parser before TensorFlow loads):
`add_parser` only declares arguments; `run` imports the rest.

    tpu-models weights list [--family F]
    tpu-models weights get NAME [--output MODEL_DIR] [--trust-unverified]
    tpu-models weights cache [--verify] [--clear NAME]
    tpu-models weights import NAME FILE_OR_DIR --output MODEL_DIR
    tpu-models evaluate MODEL_DIR/config.yaml --model-dir MODEL_DIR --set task.eval_data...

    tpu-models migrate model-garden CONFIG --checkpoint MG_CKPT --output MODEL_DIR \\
        [--family F] [--option KEY=VALUE]
"""

import os


def add_commands(subparsers) -> None:
  """Adds `weights` (list, import) and `migrate` (model-garden) to the CLI."""
  migrate = subparsers.add_parser(
      "migrate", help="convert another model zoo's checkpoint into a model_dir of ours")
  migrate.set_defaults(run=_migrate)
  sources = migrate.add_subparsers(dest="source", required=True, metavar="SOURCE")
  p = sources.add_parser(
      "model-garden", help="a TF Model Garden (tf-models-official) checkpoint of a model with "
                           "a model_garden importer (`tpu-models weights list` shows them)")
  p.add_argument("config", help="our experiment YAML describing the same architecture")
  p.add_argument("--checkpoint", required=True,
                 help="Model Garden checkpoint prefix (.../ckpt-N) or directory")
  p.add_argument("--output", required=True, help="new model_dir to write (ckpt-0, config.yaml)")
  _add_overrides(p)
  p.add_argument("--family", default=None,
                 help="the importer's family (default: the one serving task.model.name)")
  _add_options(p)

  weights = subparsers.add_parser(
      "weights", help="the catalogue of public pretrained weights; import a downloaded file")
  weights.set_defaults(run=run)
  actions = weights.add_subparsers(dest="action", required=True, metavar="ACTION")
  p = actions.add_parser("list", help="catalogue entries: source, download location, file, "
                                      "architecture, published accuracy, preprocessing")
  p.add_argument("--family", default=None, help="only this family's entries")
  p.add_argument("--verbose", "-v", action="store_true", help="every field of every entry")
  p = actions.add_parser("get", help="fetch (verified), import and cache an entry; prints its "
                                     "model_dir (TPU_MODELS_HOME, TPU_MODELS_OFFLINE, "
                                     "TPU_MODELS_WEIGHTS_MIRROR)")
  p.add_argument("name", help="a catalogue entry (`tpu-models weights list`)")
  p.add_argument("--output", default=None,
                 help="also copy the cached model_dir here (a new directory)")
  p.add_argument("--trust-unverified", action="store_true",
                 help="accept a file no SHA-256 is published for; its hash is recorded and "
                      "checked from then on (trust on first use)")
  _add_overrides(p)
  p = actions.add_parser("cache", help="what the weights cache holds; re-verify; remove")
  p.add_argument("--verify", action="store_true", help="re-hash every cached download")
  p.add_argument("--clear", default=None, metavar="NAME",
                 help="remove entry NAME's download and model_dir")
  p = actions.add_parser("import", help="write a model_dir from a downloaded weights file")
  p.add_argument("name", help="a catalogue entry (`tpu-models weights list`)")
  p.add_argument("path", metavar="FILE_OR_DIR",
                 help="the downloaded file, or the directory holding it")
  p.add_argument("--output", required=True, help="new model_dir to write")
  _add_overrides(p)


def _add_overrides(p) -> None:
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config value (repeatable)")


def _add_options(p) -> None:
  p.add_argument("--option", dest="options", action="append", default=[], metavar="KEY=VALUE",
                 help="an option of the family's importer, KEY=VALUE (repeatable)")


def run(args) -> int:
  """Runs `tpu-models weights list|import`; returns the exit code."""
  if args.action == "list":
    return _list(args)
  if args.action == "get":
    return _get(args)
  if args.action == "cache":
    return _cache(args)
  from tpu_models.weights import importing
  importing.import_weights(args.name, args.path, args.output, overrides=args.overrides)
  return 0


def _migrate(args) -> int:
  from tpu_models import config as config_lib
  from tpu_models.weights import importing
  config = config_lib.load_config(args.config, args.overrides)
  options = {".".join(key): value
             for key, value in map(config_lib.parse_override, args.options)}

  def load(model):
    return importing.load_weights(model, args.checkpoint, "model_garden", family=args.family,
                                  model_name=config.task.model.name, **options)

  importing.write_model_dir(config, args.output, load)
  return 0


def _get(args) -> int:
  import shutil
  from tpu_models.weights import cache
  model_dir = cache.get(args.name, trust_unverified=args.trust_unverified,
                        overrides=args.overrides)
  if args.output:
    if os.path.exists(args.output):
      from tpu_models.errors import ConfigError
      raise ConfigError(f"--output {args.output!r} exists; choose a new directory.")
    shutil.copytree(model_dir, args.output)
    model_dir = args.output
  print(model_dir)
  return 0


def _cache(args) -> int:
  from tpu_models.weights import cache, fetch
  if args.clear:
    removed = cache.clear(args.clear)
    print(f"Removed {len(removed)} paths of {args.clear}" +
          "".join(f"\n  {path}" for path in removed) if removed else
          f"Nothing of {args.clear} is cached.")
    return 0
  rows = cache.cached_entries()
  print(f"{fetch.home()}: {len(rows)} items")
  bad = 0
  for row in rows:
    line = f"  {row['kind']:9} {row['name']}  {row['bytes'] / 1e6:.1f} MB"
    if row["record"]:
      line += f"  ({row['record']['verified_against']})"
    if args.verify and row["kind"] == "download":
      problem = fetch.verify_cached(row["path"])
      line += "  OK" if problem is None else f"  CORRUPT: {problem}"
      bad += problem is not None
    print(line)
  return 1 if bad else 0


def _list(args) -> int:
  from tpu_models.weights import cache, catalogue
  entries = catalogue.list_weights(args.family)
  if not entries:
    families = sorted({e.family for e in catalogue.list_weights()})
    print(f"No weights of family {args.family!r}; families: {', '.join(families)}.")
    return 2
  for e in entries:
    accuracy = ", ".join(f"{k} {v:g}" for k, v in e.accuracy.items()) or "-"
    status = f"REFUSED: {e.refused}" if e.refused else f"-> {e.model}"
    cached = "cached" if cache.is_cached(e.name) else (
        "downloaded" if cache.downloaded_path(e) else "not cached")
    print(f"{e.name}  [{e.family}, {e.source_format}]  {status}  [{cached}]")
    print(f"    file {' or '.join(e.files)} from {e.download}")
    if e.remote is not None:
      check = (f"sha256 {e.remote.sha256}{'... (prefix)' if e.remote.hash_kind == 'prefix' else ''}"
               if e.remote.sha256 else "no sha256 recorded")
      print(f"    {check}: {e.remote.published}")
    print(f"    published {accuracy}")
    if args.verbose or e.preprocessing:
      if e.preprocessing:
        print(f"    preprocessing {e.preprocessing.describe()}")
    if args.verbose:
      print(f"    params {e.params}")
      if e.labels:
        where = e.labels.file or f"not offline: {e.labels.needed}"
        print(f"    labels {e.labels.name} ({e.labels.num_classes}; {where})"
              + (f"; {e.labels.convention}" if e.labels.convention else ""))
      if e.notes:
        print(f"    notes {e.notes}")
  return 0
