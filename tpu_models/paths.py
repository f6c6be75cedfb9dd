"""Checks of the local directories a command writes into (a model_dir, a sweep directory,
`predict --output-dir`), before anything is written: without TensorFlow, so the sweep
file's loader (which does not start it) can use them too."""

import os

from tpu_models.errors import ConfigError


def check_directory(path: str, role: str, writable: bool = True) -> None:
  """A ConfigError naming `path` when it cannot be the directory `role` names.

  Local paths only (elsewhere the filesystem's own error stands): `path`, or the
  nearest of its parents that exists, must be a directory, and with `writable` one
  this process can write (`os.access`, which also answers for a read-only mount,
  where even root cannot write). Checked before anything is written, so a file or a
  read-only folder is one line rather than a traceback from deep inside a write.
  """
  if "://" in path:
    return
  existing = os.path.abspath(path)
  while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
    existing = os.path.dirname(existing)
  expected = "a directory this process can create or write"
  if not os.path.isdir(existing):
    what = ("is a file, not a directory" if existing == os.path.abspath(path) else
            f"cannot be created: {existing} is a file, not a directory")
    raise ConfigError(f"{role} {path} {what}; expected {expected}. Choose another {role}.")
  if writable and not os.access(existing, os.W_OK | os.X_OK):
    read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    why = "is on a read-only filesystem" if read_only else "is not writable by this user"
    what = (f"cannot be written: it {why}" if existing == os.path.abspath(path) else
            f"cannot be created: {existing} {why}")
    raise ConfigError(f"{role} {path} {what}; expected {expected}. Choose another {role}.")
