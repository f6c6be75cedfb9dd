"""A command-line entry point's `main(argv)` run in the calling process as a program would run.

Imports nothing heavy, so the tests' own child scripts can use it before their command
imports TensorFlow (tests/test_cli_startup.py checks what that import prints).
"""

import importlib.util
import os
import sys
import traceback

from tpu_models import startup


# os.environ as a plain dict for a block: code in it never writes the process environment
# that TensorFlow's threads read (tpu_models/startup.py; light: imports no TensorFlow).
python_environ = startup.environ_kept_in_python


def exit_code_of(main, argv) -> int:
  """`main(list(argv))`'s exit code as a finished `python -m ...` reports it: its return value,
  a SystemExit's code (a message: printed, 1), an exception's traceback on stderr and 1.
  Environment variables it sets (the CLI's TF_* defaults) go to a `python_environ` copy
  that ends with it, as they would die with a child; stdout and stderr are flushed."""
  with python_environ():
    try:
      code = main(list(argv))
    except SystemExit as e:
      if e.code is None or isinstance(e.code, int):
        code = e.code or 0
      else:  # sys.exit("message"): Python prints it and exits 1.
        print(e.code, file=sys.stderr)
        code = 1
    except Exception:  # pylint: disable=broad-except  # A bug: Python prints it and exits 1.
      traceback.print_exc()
      code = 1
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
  return code


def load_script(path: str, module_name: str):
  """The Python file at `path` (a benchmarks/ script, not a package module) imported as a
  module named `module_name`, so a test can call its functions and its `main(argv)`."""
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
