"""Model builders derived from other builders: some arguments fixed, some defaults changed.

A registered builder's signature is the schema of its model config (see
`registry.model_signature` and `config._model_from_dict`), so a derived builder
must show its own: the fixed arguments gone, the new defaults in place, the
annotations kept.

    mlp_wide = register_model("mlp_wide")(preset(mlp, "mlp_wide", defaults={"width": 1024}))
    mlp_3 = register_model("mlp_3")(preset(mlp, "mlp_3", fixed={"layers": 3}))
"""

import inspect
from typing import Any, Callable, Dict, Optional


def preset(builder: Callable[..., Any], name: str, *, fixed: Optional[Dict[str, Any]] = None,
           defaults: Optional[Dict[str, Any]] = None, doc: Optional[str] = None
           ) -> Callable[..., Any]:
  """`builder` with the keyword arguments `fixed` set and `defaults` as new defaults.

  Args:
    builder: a builder taking keyword arguments.
    name: the derived builder's `__name__` (usually its registered name).
    fixed: arguments always passed; they leave the signature (passing one is a TypeError).
    defaults: arguments whose defaults change; the signature shows the new ones.
    doc: the docstring; by default it names `builder` and the changes.

  Returns:
    The derived builder (not registered).
  """
  fixed, defaults = dict(fixed or {}), dict(defaults or {})
  signature = inspect.signature(builder)
  unknown = sorted((set(fixed) | set(defaults)) - set(signature.parameters))
  if unknown:
    raise TypeError(f"{builder.__name__} has no argument(s) {', '.join(unknown)}.")

  def derived(**kwargs):
    given = sorted(set(kwargs) & set(fixed))
    if given:
      raise TypeError(f"{name} fixes {', '.join(given)}; it is not an argument.")
    return builder(**{**defaults, **kwargs, **fixed})

  parameters = [p.replace(default=defaults[p.name]) if p.name in defaults else p
                for p in signature.parameters.values() if p.name not in fixed]
  derived.__signature__ = signature.replace(parameters=parameters)
  derived.__annotations__ = {k: v for k, v in getattr(builder, "__annotations__", {}).items()
                             if k not in fixed}
  derived.__name__ = derived.__qualname__ = name
  changes = [f"{k}={v!r} fixed" for k, v in fixed.items()]
  changes += [f"{k}={v!r}" for k, v in defaults.items()]
  derived.__doc__ = doc or f"`{builder.__name__}` with {', '.join(changes) or 'its defaults'}."
  return derived
