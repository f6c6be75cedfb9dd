"""Errors that mean "the user's input is wrong", as opposed to a bug in the code.

The CLI prints these as one clear line (exit 2); anything else is a bug and keeps
its traceback.

    ConfigError         a config key or value is wrong (names the key and what is valid)
    DataError           input data is missing, corrupt or out of range (names the file/record)
    MissingExtraError   an optional dependency is not installed (names the pip command)
    UnknownNameError    no registered model/task/dataset has this name (lists close matches)
    DiskFullError       a write failed for lack of space (names the path and the free space)
    ExportMismatchError an export answers otherwise than the SavedModel path (names how often)

One raised while TensorFlow traces a step reaches the caller wrapped in AutoGraph's
StagingError (a FileNotFoundError among them); `user_error_behind` finds it again.
"""


class ConfigError(ValueError):
  """A config key or value is wrong; the message names it and what is expected."""


class DataError(ValueError):
  """Input data is missing, corrupt or out of range; the message names where and how to fix it."""


class MissingExtraError(ImportError):
  """An optional dependency is missing; the message names the extra to install."""


class UnknownNameError(KeyError):
  """No registered entry has this name; the message lists close matches."""

  def __str__(self) -> str:  # KeyError would print the message in quotes.
    return str(self.args[0]) if self.args else ""


class DiskFullError(OSError):
  """A write failed because the disk (or quota) is full; names the path, the free space and
  what was kept."""

  def __str__(self) -> str:  # OSError would prefix "[Errno N]" when given an errno.
    return str(self.args[0]) if self.args else ""


class ExportMismatchError(ValueError):
  """A converted export gives other answers than the SavedModel path on the task's own
  examples; names how often they agree, the floor, and that the old export was kept."""


USER_ERRORS = (ConfigError, DataError, MissingExtraError, UnknownNameError, FileNotFoundError,
               DiskFullError, ExportMismatchError)


def user_error_behind(error: BaseException):
  """The `USER_ERRORS` instance `error` is, or wraps as AutoGraph's StagingError; else None.

  AutoGraph re-raises an error from a traced function as its own type only for a few
  types (ValueError, TypeError, ...); any other (FileNotFoundError, DiskFullError) comes
  out as a StagingError whose context is the original. Only that wrapper is looked
  through: a bug raised while handling a user error stays a bug.
  """
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, USER_ERRORS):
      return error
    if type(error).__name__ != "StagingError":
      return None
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None
