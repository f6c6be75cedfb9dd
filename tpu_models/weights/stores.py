"""Tensor stores: a weights file (or directory) read as {name: numpy array}.

    store = open_store("model.safetensors")
    store.names()               # every tensor name in the file
    store.shape("fc.weight")    # (1000, 2048), without reading the values
    store.get("fc.weight")      # np.ndarray

Formats (`FORMATS`):
  object_graph  a TF2 object-graph checkpoint (`tf.train.Checkpoint`, e.g. a
                Model Garden trainer checkpoint): names are object paths
                ("model/_backbone/layer_with_weights-0/kernel"); every path
                through the object graph resolves, and "name:<layer>/<var>"
                looks a variable up by its Keras 2 name.
  safetensors   a `.safetensors` file (the `safetensors` package's numpy API;
                no torch needed): PyTorch state-dict names ("layer1.0.conv1.weight").
  keras_preset  a keras-hub preset directory (`config.json` + `model.weights.h5`,
                read with h5py): names are the h5 paths of the variables
                ("layers/conv1_conv/vars/0"); `store.config` is config.json.
  torch         a `.pth`/`.pt`/`.bin` state dict, only when torch is importable,
                loaded with `torch.load(weights_only=True)` (no pickled code runs).

Every store remembers which names were read (`used`), so the name-map
assignment can report the tensors of a file that nothing took.
"""

import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from tpu_models.errors import ConfigError, DataError

FORMATS = ("object_graph", "safetensors", "keras_preset", "torch")
_TORCH_SUFFIXES = (".pth", ".pt", ".bin")
_KERAS_PRESET_FILES = ("config.json", "model.weights.h5")


class TensorStore:
  """Named numpy tensors of one weights file. Subclasses fill `_shapes` and `_read`."""

  format = ""

  def __init__(self, path: str):
    self.path = path
    self._shapes: Dict[str, Tuple[int, ...]] = {}
    self.used: set = set()

  def names(self) -> List[str]:
    """Every tensor name (sorted)."""
    return sorted(self._shapes)

  def model_names(self) -> List[str]:
    """The names that must be used by a complete import (default: all)."""
    return self.names()

  def resolve(self, candidate: str) -> Optional[str]:
    """The stored name `candidate` refers to, or None (subclasses add aliases)."""
    return candidate if candidate in self._shapes else None

  def shape(self, name: str) -> Tuple[int, ...]:
    return tuple(self._shapes[name])

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` as a numpy array; marks it used."""
    if name not in self._shapes:
      raise KeyError(f"{name!r} is not in {self.path}")
    self.used.add(name)
    return self._read(name)

  def _read(self, name: str) -> np.ndarray:
    raise NotImplementedError

  def describe(self, name: str) -> str:
    """A readable form of a stored name (for reports)."""
    return name


# ----------------------------------------------------------------------------
# TF2 object-graph checkpoints.

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
# Root objects of a trainer checkpoint that hold no model weights.
_NON_MODEL_ROOTS = ("optimizer", "global_step", "save_counter")
_MAX_ALIASES_PER_NODE = 64  # Paths kept per object (a DAG: layers are reachable several ways).


class ObjectGraphStore(TensorStore):
  """The variables of a TF2 object-graph checkpoint, by every object path and by name.

  Stored names are checkpoint keys; `resolve` maps an object path (or
  "name:<variable name>") to its key. Only keys outside the optimizer, step and
  save counter must be used (`model_names`).

  Args:
    path: a checkpoint prefix (".../ckpt-100") or a directory (its latest).
  """

  format = "object_graph"

  def __init__(self, path: str):
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    if tf.io.gfile.isdir(path):
      latest = tf.train.latest_checkpoint(path)
      if latest is None:
        raise FileNotFoundError(f"No checkpoint in directory {path!r} (expected a 'checkpoint' "
                                f"state file or pass a prefix such as {path}/ckpt-100).")
      path = latest
    try:
      self.reader = tf.train.load_checkpoint(path)
    except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError) as e:
      raise FileNotFoundError(f"Checkpoint {path!r} is not readable: {e}") from None
    super().__init__(path)
    shapes = self.reader.get_variable_to_shape_map()
    if "_CHECKPOINTABLE_OBJECT_GRAPH" not in shapes:
      raise ConfigError(f"{path!r} is a TF1 name-based checkpoint; TF2 object-graph "
                        f"checkpoints (tf.train.Checkpoint) are expected.")
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(self.reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    self.by_path: Dict[str, str] = {}  # Object path of a variable -> checkpoint key.
    self.by_name: Dict[str, str] = {}  # Variable name (Keras 2 "layer/kernel") -> key.
    self.model_keys: set = set()  # Keys of variables outside optimizer/step.
    paths: Dict[int, List[str]] = {0: [""]}
    frontier = [0]
    while frontier:  # Breadth first: every node gets its shortest paths first.
      next_frontier = []
      for node_id in frontier:
        for child in graph.nodes[node_id].children:
          child_paths = paths.setdefault(child.node_id, [])
          new = child.node_id not in paths or not child_paths
          for parent_path in paths[node_id]:
            if len(child_paths) >= _MAX_ALIASES_PER_NODE:
              break
            child_path = f"{parent_path}/{child.local_name}" if parent_path else child.local_name
            if child_path not in child_paths:
              child_paths.append(child_path)
              new = True
          if new and child.node_id not in next_frontier:
            next_frontier.append(child.node_id)
      frontier = next_frontier
    for node_id, node in enumerate(graph.nodes):
      for attribute in node.attributes:
        if attribute.name != "VARIABLE_VALUE":
          continue
        key = attribute.checkpoint_key
        self._shapes[key] = tuple(shapes[key])
        for node_path in paths.get(node_id, []):
          self.by_path[node_path] = key
          if node_path.split("/")[0] not in _NON_MODEL_ROOTS:
            self.model_keys.add(key)
        if attribute.full_name:
          self.by_name.setdefault(attribute.full_name, key)

  def model_names(self) -> List[str]:
    return sorted(self.model_keys)

  def resolve(self, candidate: str) -> Optional[str]:
    if candidate.startswith("name:"):
      key = self.by_name.get(candidate[len("name:"):])
    else:
      key = self.by_path.get(candidate)
    return key if key is not None and key in self.model_keys else None

  def _read(self, name: str) -> np.ndarray:
    return self.reader.get_tensor(name)

  def describe(self, name: str) -> str:
    """A checkpoint key's object path (without the attribute suffix)."""
    return name[:-len(_VALUE_SUFFIX)] if name.endswith(_VALUE_SUFFIX) else name


# ----------------------------------------------------------------------------
# Files of PyTorch state dicts and keras-hub presets.


class SafetensorsStore(TensorStore):
  """A `.safetensors` file through the `safetensors` package's numpy API (no torch)."""

  format = "safetensors"

  def __init__(self, path: str):
    super().__init__(path)
    safe_open = _import_safetensors()
    try:
      with safe_open(path, framework="numpy") as f:
        for name in f.keys():
          self._shapes[name] = tuple(f.get_slice(name).get_shape())
    except Exception as e:  # safetensors raises its own error types for a bad header.
      raise DataError(f"{path!r} is not a readable .safetensors file "
                      f"({type(e).__name__}: {e}).") from None

  def _read(self, name: str) -> np.ndarray:
    safe_open = _import_safetensors()
    try:
      with safe_open(self.path, framework="numpy") as f:
        return f.get_tensor(name)
    except Exception as e:
      raise DataError(f"{self.path!r}: tensor {name!r} cannot be read (a truncated file?) "
                      f"({type(e).__name__}: {e}).") from None


def _import_safetensors():
  try:
    from safetensors import safe_open
  except ImportError:
    raise ConfigError('Reading .safetensors files needs the safetensors package: '
                      'pip install "tpu_models[weights]"') from None
  return safe_open


class TorchStore(TensorStore):
  """A `.pth` state dict, read with torch (when installed) and `weights_only=True`."""

  format = "torch"

  def __init__(self, path: str):
    super().__init__(path)
    try:
      import torch
    except ImportError:
      raise ConfigError(f"{path!r} is a PyTorch pickle; reading it needs torch (not a "
                        f"dependency of tpu_models). Install torch, or convert the file to "
                        f".safetensors where torch is installed (safetensors.torch.save_file)."
                        ) from None
    try:
      state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
      raise DataError(f"{path!r} is not a readable PyTorch state dict "
                      f"({type(e).__name__}: {e}).") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
      state = state["state_dict"]  # Training checkpoints wrap the state dict.
    if not isinstance(state, dict):
      raise DataError(f"{path!r} holds a {type(state).__name__}, not a state dict "
                      f"{{name: tensor}}.")
    self._values = {name: value.detach().cpu().numpy() for name, value in state.items()
                    if hasattr(value, "detach")}
    self._shapes = {name: tuple(v.shape) for name, v in self._values.items()}

  def _read(self, name: str) -> np.ndarray:
    return self._values[name]


class KerasPresetStore(TensorStore):
  """A keras-hub preset directory: `config.json` and `model.weights.h5` (read with h5py).

  Names are the h5 dataset paths of the variables, e.g. "layers/conv2d_3/vars/0"
  (Keras names them by class and order, not by layer name); a task preset's
  `task.weights.h5` (the head) adds its datasets under "task/". `config` is
  the parsed config.json, `task_config` task.json's (or None).
  """

  format = "keras_preset"

  def __init__(self, path: str):
    super().__init__(path)
    missing = [f for f in _KERAS_PRESET_FILES if not os.path.exists(os.path.join(path, f))]
    if missing:
      raise DataError(f"{path!r} is not a keras-hub preset directory: it lacks "
                      f"{', '.join(missing)} (expected {' and '.join(_KERAS_PRESET_FILES)}).")
    with open(os.path.join(path, "config.json")) as f:
      self.config = json.load(f)
    self.task_config = None
    if os.path.exists(os.path.join(path, "task.json")):
      with open(os.path.join(path, "task.json")) as f:
        self.task_config = json.load(f)
    import h5py
    self._files = {"": os.path.join(path, "model.weights.h5")}
    if os.path.exists(os.path.join(path, "task.weights.h5")):
      self._files["task/"] = os.path.join(path, "task.weights.h5")
    for prefix, file_name in self._files.items():
      try:
        with h5py.File(file_name, "r") as h5:
          h5.visititems(lambda name, node, prefix=prefix: self._visit(prefix, name, node))
      except OSError as e:
        raise DataError(f"{file_name!r} is not a readable HDF5 file (a truncated download?): "
                        f"{e}") from None

  def _visit(self, prefix: str, name: str, node) -> None:
    import h5py
    if isinstance(node, h5py.Dataset):
      self._shapes[prefix + name] = tuple(node.shape)

  def _read(self, name: str) -> np.ndarray:
    import h5py
    prefix = "task/" if name.startswith("task/") and "task/" in self._files else ""
    with h5py.File(self._files[prefix], "r") as h5:
      return np.asarray(h5[name[len(prefix):]])


def detect_format(path: str) -> str:
  """The store format of `path` from its name and contents; DataError when none fits."""
  if os.path.isdir(path):
    if all(os.path.exists(os.path.join(path, f)) for f in _KERAS_PRESET_FILES):
      return "keras_preset"
    if os.path.exists(os.path.join(path, "checkpoint")):
      return "object_graph"
  elif path.endswith(".safetensors"):
    return "safetensors"
  elif path.endswith(_TORCH_SUFFIXES):
    return "torch"
  elif os.path.exists(path + ".index"):
    return "object_graph"
  raise DataError(f"Cannot tell the weights format of {path!r}; expected a .safetensors file, "
                  f"a .pth state dict, a keras-hub preset directory (config.json + "
                  f"model.weights.h5) or a TF2 checkpoint (prefix or directory).")


_STORES = {"object_graph": ObjectGraphStore, "safetensors": SafetensorsStore,
           "keras_preset": KerasPresetStore, "torch": TorchStore}


def open_store(path: str, format: Optional[str] = None) -> TensorStore:
  """Opens `path` as a tensor store of `format` (default: `detect_format`)."""
  format = format or detect_format(path)
  if format not in _STORES:
    raise ConfigError(f"Unknown weights format {format!r}; expected one of {', '.join(FORMATS)}.")
  if format != "object_graph" and not os.path.exists(path):
    raise FileNotFoundError(f"{path!r} does not exist.")
  return _STORES[format](path)

