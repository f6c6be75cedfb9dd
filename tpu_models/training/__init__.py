"""The common training loop and its parts.

Nothing is imported here eagerly: importing one part (`training.checkpoints`,
`training.precision`) must not import the Trainer and everything it needs.
`from tpu_models.training import Trainer` still works, looked up when used.
"""

_LAZY = {"Trainer": "trainer", "NonFiniteLoss": "trainer", "Preempted": "trainer",
         "precision_policy": "precision"}


def __getattr__(name: str):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
