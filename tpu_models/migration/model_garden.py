"""Load TF Model Garden (tf-models-official, Keras 2) checkpoints into tpu_models models.

    from tpu_models.migration import model_garden
    model = create_model("retinanet_resnet50_fpn", num_classes=90, image_size=640)
    report = model_garden.load_model_garden_checkpoint(model, "/ckpts/retinanet/ckpt-33264",
                                                       family="retinanet")
    print(report.summary())

    # Or write a model_dir that `tpu-models evaluate/export` read as it is and
    # `trainer.init_checkpoint` warm-starts from:
    model_garden.convert_model_garden_checkpoint("my_retinanet.yaml", "/ckpts/retinanet/ckpt-33264",
                                                 "runs/from_model_garden")

A Model Garden checkpoint is a TF2 object-graph checkpoint written by its
trainer: `tf.train.Checkpoint(global_step, model, optimizer, **checkpoint_items)`.
Its variables are found by object path (e.g. `model/_backbone/layer_with_weights-3/
_conv1/kernel`; every path through the object graph is accepted, so backbone-only
checkpoints and trainer checkpoints both load) or, where the object path is an
artefact of Keras's graph traversal (the FPN), by the variable's own name
(`lateral_3/kernel`). One explicit name map per family says where each of our
variables comes from:

  resnet       `resnet_imagenet` ClassificationModel -> tpu_models `resnet*`.
  retinanet    `retinanet_resnetfpn_coco` RetinaNetModel -> `retinanet*`.
  transformer  `Seq2SeqTransformer` (translation task) -> `transformer*`.

Every variable of our model must be found, every variable of the Model Garden
model must be used, and shapes must agree; otherwise `ModelGardenMismatchError`
names every unmatched variable on either side and every shape mismatch. Layout
conversions are explicit (see each family's map): the RetinaNet classifier drops
Model Garden's background class 0, attention kernels [d, heads, depth] are
reshaped to [d, d] and Q/K/V fused into one kernel.

Settings that must match for parity (they change no variable, so the checkpoint
cannot tell): ResNet `bn_epsilon` (Model Garden resnet_imagenet 1e-5, RetinaNet
1e-3: our defaults), input normalisation (both models take normalised images),
and for Model Garden's ResNet-18/34 `project_first_shortcut: true` (it projects
the shortcut of the first block of every stage; checked: the loader fails
without it).
"""

import dataclasses
import json
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tpu_models.errors import ConfigError

FAMILIES = ("resnet", "retinanet", "transformer")
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
# Root objects of a Model Garden trainer checkpoint that hold no model weights.
_NON_MODEL_ROOTS = ("optimizer", "global_step", "save_counter")
_BN_VARIABLES = ("gamma", "beta", "moving_mean", "moving_variance")
_MAX_ALIASES_PER_NODE = 64  # Paths kept per object (a DAG: layers are reachable several ways).


class ModelGardenMismatchError(ConfigError):
  """The checkpoint and the model do not correspond; the message lists every difference."""


# ----------------------------------------------------------------------------
# Reading a Model Garden checkpoint by object path or variable name.


class ModelGardenCheckpoint:
  """The variables of a TF2 object-graph checkpoint, by every object path and by name.

  Args:
    path: a checkpoint prefix (".../ckpt-100") or a directory (its latest).
  """

  def __init__(self, path: str):
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
      raise FileNotFoundError(f"Model Garden checkpoint {path!r} is not readable: {e}") from None
    self.path = path
    self.shapes = self.reader.get_variable_to_shape_map()
    if "_CHECKPOINTABLE_OBJECT_GRAPH" not in self.shapes:
      raise ConfigError(f"{path!r} is a TF1 name-based checkpoint; Model Garden TF2 checkpoints "
                        f"(tf.train.Checkpoint) are expected.")
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
        for node_path in paths.get(node_id, []):
          self.by_path[node_path] = key
          if node_path.split("/")[0] not in _NON_MODEL_ROOTS:
            self.model_keys.add(key)
        if attribute.full_name:
          self.by_name.setdefault(attribute.full_name, key)

  def find(self, source: "Source") -> Optional[str]:
    """The checkpoint key of the first candidate of `source` present, or None."""
    for candidate in source.candidates:
      if candidate.startswith("name:"):
        key = self.by_name.get(candidate[len("name:"):])
      else:
        key = self.by_path.get(candidate)
      if key is not None and key in self.model_keys:
        return key
    return None

  def describe(self, key: str) -> str:
    """A readable name of a checkpoint key: its object path (without the attribute suffix)."""
    return key[:-len(_VALUE_SUFFIX)] if key.endswith(_VALUE_SUFFIX) else key


@dataclasses.dataclass
class Source:
  """Where one of our variables comes from.

  candidates: object paths in the checkpoint (tried in order; the first
    present wins) or "name:<variable name>" for a lookup by Keras 2 name.
  transform: applied to the numpy value (layout conversions); None = as is.
  note: what the transform does, for the report.
  """
  candidates: Tuple[str, ...]
  transform: Optional[Callable[[np.ndarray], np.ndarray]] = None
  note: str = ""
  # Checkpoint keys of further inputs of `transform` (fused projections), found like candidates.
  extra: Tuple[Tuple[str, ...], ...] = ()


NameMap = Dict[str, Source]


def _under(roots: Sequence[str], suffix: str) -> Tuple[str, ...]:
  return tuple(f"{root}/{suffix}" for root in roots)


# ----------------------------------------------------------------------------
# ResNet (`resnet_imagenet`: ClassificationModel over official.vision ResNet).

# Model Garden's ResNet backbone is a functional Keras 2 model whose weighted
# layers are, in order: the stem conv (0), the stem BN (1), then one
# ResidualBlock / BottleneckBlock per block, stage by stage (2, 3, ...). Inside a
# block: _conv1.._conv3 with _norm1.._norm3 after them, and _shortcut / _norm0
# for the projection shortcut.
_RESNET_BLOCK_LAYERS = {  # Our layer suffix -> the block attribute in Model Garden.
    "conv1": "_conv1", "bn1": "_norm1",
    "conv2": "_conv2", "bn2": "_norm2",
    "conv3": "_conv3", "bn3": "_norm3",
    "shortcut_conv": "_shortcut", "shortcut_bn": "_norm0",
}
# Where the backbone sits: a trainer checkpoint (model._backbone, or the
# `backbone` checkpoint item), or the classifier's first weighted layer.
_BACKBONE_ROOTS = ("model/_backbone", "backbone", "model/layer_with_weights-0")
_BLOCK_RE = re.compile(r"^stage(\d)_block(\d+)_")


def _layer_variables(ours: str, theirs_roots: Sequence[str], names: Sequence[str]) -> NameMap:
  return {f"{ours}/{name}": Source(_under(theirs_roots, name)) for name in names}


def resnet_backbone_name_map(our_paths: Sequence[str], prefix: str = "",
                             roots: Sequence[str] = _BACKBONE_ROOTS) -> NameMap:
  """Our ResNet backbone variables -> Model Garden's ResNet backbone (by object path).

  Args:
    our_paths: our model's variable paths (the blocks are read from them).
    prefix: our backbone's path prefix ("" for the classifier, "backbone/" in RetinaNet).
    roots: candidate object paths of Model Garden's backbone in the checkpoint.

  Returns:
    {our variable path: Source}.
  """
  name_map: NameMap = {}
  name_map.update(_layer_variables(f"{prefix}conv1", _under(roots, "layer_with_weights-0"),
                                   ["kernel"]))
  name_map.update(_layer_variables(f"{prefix}bn1", _under(roots, "layer_with_weights-1"),
                                   _BN_VARIABLES))
  blocks = sorted({(int(m.group(1)), int(m.group(2))) for path in our_paths
                   for m in [_BLOCK_RE.match(path[len(prefix):])]
                   if path.startswith(prefix) and m})
  for index, (stage, block) in enumerate(blocks, start=2):
    block_roots = _under(roots, f"layer_with_weights-{index}")
    for ours, theirs in _RESNET_BLOCK_LAYERS.items():
      names = ["kernel"] if "conv" in ours else _BN_VARIABLES
      name_map.update(_layer_variables(f"{prefix}stage{stage}_block{block}_{ours}",
                                       _under(block_roots, theirs), names))
  return name_map


def resnet_name_map(our_paths: Sequence[str]) -> NameMap:
  """The `resnet_imagenet` classifier: the backbone map, and the Dense head.

  Model Garden's ClassificationModel is functional: backbone (weighted layer
  0), global average pool, dropout, Dense (weighted layer 1) -> our `logits`.
  """
  name_map = resnet_backbone_name_map(our_paths)
  for name in ("kernel", "bias"):
    name_map[f"logits/{name}"] = Source((f"model/layer_with_weights-1/{name}",))
  return name_map


# ----------------------------------------------------------------------------
# RetinaNet (`retinanet_resnetfpn_coco`: RetinaNetModel = ResNet + FPN + RetinaNetHead).

_DECODER_LAYERS = {  # Our FPN layer -> Model Garden's FPN layer name (by variable name).
    "lateral_p{level}": "lateral_{level}",
    "output_p{level}": "post_hoc_{level}",
    "coarser_p{level}": "coarser_{level}",
    "bn_p{level}": "norm_{level}",
}
_HEAD_ROOTS = ("model/_head", "head")
_HEAD_SUBNETS = {"class": ("_cls_convs", "_cls_norms", "_classifier", "class_logits"),
                 "box": ("_box_convs", "_box_norms", "_box_regressor", "box_deltas")}


def _drop_background(anchors_per_location: int) -> Callable[[np.ndarray], np.ndarray]:
  """Classifier kernel [..., A * K] or bias [A * K] -> [..., A * (K - 1)] without class 0."""

  def transform(value: np.ndarray) -> np.ndarray:
    lead, last = value.shape[:-1], value.shape[-1]
    if last % anchors_per_location:
      raise ModelGardenMismatchError(
          f"Model Garden classifier has {last} outputs, not a multiple of the {anchors_per_location} "
          f"anchors per location of this model (num_scales * len(aspect_ratios)).")
    per_anchor = value.reshape(*lead, anchors_per_location, last // anchors_per_location)
    return per_anchor[..., 1:].reshape(*lead, -1)

  return transform


def retinanet_name_map(our_paths: Sequence[str], drop_background: bool = True) -> NameMap:
  """Our RetinaNet -> Model Garden's RetinaNetModel.

  backbone/...                 ResNet map under model/_backbone (or `backbone`).
  fpn/{lateral,output}_p{l}    FPN `lateral_{l}`, `post_hoc_{l}` (by variable name).
  fpn/coarser_p{l}, bn_p{l}    FPN `coarser_{l}`, `norm_{l}`.
  head/class_conv{i}           head `_cls_convs/{i}` (shared over levels).
  head/class_bn{i}_p{l}        head `_cls_norms/{l - min_level}/{i}` (one BN per level).
  head/class_logits            head `_classifier`; Model Garden predicts K + 1 classes
                               per anchor with background at 0: dropped (our K real
                               classes, class c = Model Garden's c + 1) unless
                               `drop_background=False` (then num_classes = K + 1).
  head/box_*                   head `_box_convs`, `_box_norms`, `_box_regressor`.
  """
  name_map = resnet_backbone_name_map(our_paths, prefix="backbone/")
  levels = sorted({int(m.group(1)) for p in our_paths
                   for m in [re.match(r"^fpn/\w+_p(\d)/", p)] if m})
  min_level = min(levels) if levels else 3
  for level in levels:
    for ours, theirs in _DECODER_LAYERS.items():
      names = _BN_VARIABLES if ours.startswith("bn") else ("kernel", "bias")
      for name in names:
        name_map[f"fpn/{ours.format(level=level)}/{name}"] = Source(
            (f"name:{theirs.format(level=level)}/{name}",))
  for kind, (convs, norms, predictor, ours_predictor) in _HEAD_SUBNETS.items():
    conv_ids = sorted({int(m.group(1)) for p in our_paths
                       for m in [re.match(rf"^head/{kind}_conv(\d+)/", p)] if m})
    for i in conv_ids:
      for name in ("kernel", "bias"):
        name_map[f"head/{kind}_conv{i}/{name}"] = Source(_under(_HEAD_ROOTS, f"{convs}/{i}/{name}"))
      for level in levels:
        for name in _BN_VARIABLES:
          name_map[f"head/{kind}_bn{i}_p{level}/{name}"] = Source(
              _under(_HEAD_ROOTS, f"{norms}/{level - min_level}/{i}/{name}"))
    for name in ("kernel", "bias"):
      name_map[f"head/{ours_predictor}/{name}"] = Source(_under(_HEAD_ROOTS, f"{predictor}/{name}"))
  if drop_background:
    for name in ("kernel", "bias"):
      source = name_map[f"head/class_logits/{name}"]
      source.note = "background class 0 dropped per anchor"
  return name_map


# ----------------------------------------------------------------------------
# Transformer (`Seq2SeqTransformer` of the translation task).

# Model Garden's attention is Keras MultiHeadAttention: query/key/value kernels
# [d, heads, depth] and an output kernel [heads, depth, d], no biases
# (use_bias=False). Ours keeps [d, d] matrices (heads contiguous in the
# columns, the same order) with Q, K and V fused into one [d, 3d] kernel and
# the cross-attention's K and V into one [d, 2d] kernel.
_MG_ENCODER_LAYER = {  # Our layer attribute -> Model Garden TransformerEncoderBlock attribute.
    "self_attention": "_attention_layer",
    "self_attention_norm": "_attention_layer_norm",
    "ffn/inner": "_intermediate_dense",
    "ffn/outer": "_output_dense",
    "ffn_norm": "_output_layer_norm",
}
_MG_DECODER_LAYER = {  # ... -> Model Garden TransformerDecoderBlock attribute.
    "self_attention": "self_attention",
    "self_attention_norm": "self_attention_layer_norm",
    "cross_attention": "encdec_attention",
    "cross_attention_norm": "encdec_attention_layer_norm",
    "ffn/inner": "intermediate_dense",
    "ffn/outer": "output_dense",
    "ffn_norm": "output_layer_norm",
}
_NOT_WEIGHTS_RE = re.compile(r"(^|/)seed_generator(_\d+)?/")  # Dropout RNG state, not weights.


def _fuse_columns(*kernels: np.ndarray) -> np.ndarray:
  """[d, heads, depth] kernels -> one [d, n * heads * depth] kernel (Q | K | V)."""
  return np.concatenate([k.reshape(k.shape[0], -1) for k in kernels], axis=1)


def _attention_sources(ours: str, theirs: str, cross: bool) -> NameMap:
  q, k, v, o = (f"{theirs}/_{name}_dense/kernel" for name in ("query", "key", "value", "output"))
  out = {f"{ours}/output_kernel": Source(
      (o,), lambda x: x.reshape(-1, x.shape[-1]), "[heads, depth, d] -> [d, d]")}
  if cross:
    out[f"{ours}/query_kernel"] = Source(
        (q,), lambda x: x.reshape(x.shape[0], -1), "[d, heads, depth] -> [d, d]")
    out[f"{ours}/key_value_kernel"] = Source(
        (k,), _fuse_columns, "key | value fused into [d, 2d]", extra=((v,),))
  else:
    out[f"{ours}/qkv_kernel"] = Source(
        (q,), _fuse_columns, "query | key | value fused into [d, 3d]", extra=((k,), (v,)))
  return out


def transformer_name_map(our_paths: Sequence[str], root: str = "transformer") -> NameMap:
  """Our encoder-decoder Transformer -> Model Garden's Seq2SeqTransformer.

  {root}/shared_embedding/embeddings   model/embedding_lookup/embeddings (one matrix:
                                       source, target and softmax, as ours with
                                       share_embeddings)
  encoder_layer_{i}/...                model/encoder_layer/encoder_layers/{i}/...
  decoder_layer_{i}/...                model/decoder_layer/decoder_layers/{i}/...
  encoder_norm, decoder_norm           {encoder,decoder}_layer/output_normalization
  Within a layer see _MG_ENCODER_LAYER / _MG_DECODER_LAYER; attention kernels
  are reshaped and fused (`_attention_sources`).
  """
  name_map: NameMap = {f"{root}/shared_embedding/embeddings":
                       Source(("model/embedding_lookup/embeddings",))}
  for stack, table in (("encoder", _MG_ENCODER_LAYER), ("decoder", _MG_DECODER_LAYER)):
    name_map.update(_layer_variables(f"{root}/{stack}_norm",
                                     (f"model/{stack}_layer/output_normalization",),
                                     ("gamma", "beta")))
    layers = sorted({int(m.group(1)) for p in our_paths
                     for m in [re.match(rf"^{root}/{stack}_layer_(\d+)/", p)] if m})
    for i in layers:
      ours_layer = f"{root}/{stack}_layer_{i}"
      theirs_layer = f"model/{stack}_layer/{stack}_layers/{i}"
      for ours, theirs in table.items():
        if ours.endswith("attention"):
          name_map.update(_attention_sources(f"{ours_layer}/{ours}", f"{theirs_layer}/{theirs}",
                                             cross=ours == "cross_attention"))
        elif ours.endswith("norm"):
          name_map.update(_layer_variables(f"{ours_layer}/{ours}", (f"{theirs_layer}/{theirs}",),
                                           ("gamma", "beta")))
        else:  # ffn/inner, ffn/outer: our inner_kernel / inner_bias.
          for name in ("kernel", "bias"):
            name_map[f"{ours_layer}/{ours}_{name}"] = Source((f"{theirs_layer}/{theirs}/{name}",))
  return name_map


# ----------------------------------------------------------------------------
# Loading.


@dataclasses.dataclass
class MigrationReport:
  """What `load_model_garden_checkpoint` did.

  loaded: (our variable path, Model Garden object path or name, note) per variable.
  """
  family: str
  checkpoint: str
  loaded: List[Tuple[str, str, str]]

  def summary(self) -> str:
    converted = [f"  {ours} <- {theirs} ({note})" for ours, theirs, note in self.loaded if note]
    return "\n".join([f"Loaded {len(self.loaded)} variables of a Model Garden {self.family} "
                      f"checkpoint from {self.checkpoint}; converted layouts:"] +
                     (converted or ["  (none)"]))

  def to_json(self) -> Dict[str, object]:
    return {"family": self.family, "checkpoint": self.checkpoint,
            "loaded": [{"ours": o, "model_garden": t, "note": n} for o, t, n in self.loaded]}


def name_map_for(model, family: str, **options) -> NameMap:
  """The name map of `family` for `model` (see the family's `*_name_map`)."""
  paths = [v.path for v in model.variables]
  if family == "resnet":
    return resnet_name_map(paths)
  if family == "retinanet":
    name_map = retinanet_name_map(paths, drop_background=options.get("drop_background", True))
    if options.get("drop_background", True):
      transform = _drop_background(_anchors_per_location(model))
      for name in ("kernel", "bias"):
        name_map[f"head/class_logits/{name}"].transform = transform
    return name_map
  if family == "transformer":
    return transformer_name_map(paths, root=model.name)
  raise ConfigError(f"Unknown Model Garden family {family!r}; expected one of "
                    f"{', '.join(FAMILIES)}.")


def _anchors_per_location(model) -> int:
  box_bias = next(v for v in model.variables if v.path == "head/box_deltas/bias")
  return int(box_bias.shape[0]) // 4


def load_model_garden_checkpoint(model, checkpoint_path: str, family: str, *,
                                 drop_background: bool = True) -> MigrationReport:
  """Assigns a Model Garden checkpoint's weights to `model` (a built tpu_models model).

  Args:
    model: our Keras model of the same architecture (e.g. `create_model(
      "resnet50", num_classes=1000)`); its variables must exist (functional
      models have them once built).
    checkpoint_path: a Model Garden checkpoint prefix or directory (trainer
      checkpoint or one holding the model's `checkpoint_items`).
    family: "resnet" (resnet_imagenet classifier), "retinanet"
      (retinanet_resnetfpn_coco) or "transformer" (Seq2SeqTransformer).
    drop_background: RetinaNet only: drop Model Garden's background class 0
      (our num_classes = Model Garden's - 1). False keeps it (num_classes equal).

  Returns:
    A `MigrationReport`.

  Raises:
    ModelGardenMismatchError: a variable of ours is not in the checkpoint, a
      model variable of the checkpoint is not used, or shapes differ; the
      message lists all of them (with a hint for the classifier width).
    FileNotFoundError: the checkpoint cannot be read.
  """
  if family not in FAMILIES:
    raise ConfigError(f"Unknown Model Garden family {family!r}; expected one of "
                      f"{', '.join(FAMILIES)}.")
  checkpoint = ModelGardenCheckpoint(checkpoint_path)
  name_map = name_map_for(model, family, drop_background=drop_background)
  unmapped, missing, mismatched, used = [], [], [], set()
  assignments = []
  loaded = []
  for variable in model.variables:
    if _NOT_WEIGHTS_RE.search(variable.path):
      continue
    source = name_map.get(variable.path)
    if source is None:
      unmapped.append(variable.path)
      continue
    key = checkpoint.find(source)
    extra_keys = [checkpoint.find(Source(c)) for c in source.extra]
    if key is None or any(k is None for k in extra_keys):
      missing.append(f"{variable.path} (looked for {source.candidates[0]})")
      continue
    used.add(key)
    used.update(extra_keys)
    values = [checkpoint.reader.get_tensor(k) for k in [key] + extra_keys]
    value = source.transform(*values) if source.transform else values[0]
    if tuple(value.shape) != tuple(variable.shape):
      hint = ""
      if variable.path.endswith(("logits/kernel", "logits/bias")):
        hint = " (a different num_classes?)"
      mismatched.append(f"{variable.path}: ours {list(variable.shape)}, Model Garden "
                        f"{checkpoint.describe(key)} {list(value.shape)}{hint}")
      continue
    assignments.append((variable, value))
    loaded.append((variable.path, checkpoint.describe(key), source.note))
  unused = sorted(checkpoint.describe(k) for k in checkpoint.model_keys - used)
  if unmapped or missing or mismatched or unused:
    lines = [f"Model Garden {family} checkpoint {checkpoint.path} does not match model "
             f"{model.name!r}:"]
    for title, items in (("our variables with no Model Garden name", unmapped),
                         ("our variables not in the checkpoint", missing),
                         ("shape mismatches", mismatched),
                         ("checkpoint variables this model has no place for", unused)):
      if items:
        lines.append(f"  {len(items)} {title}: " + "; ".join(items[:12]) +
                     ("; ..." if len(items) > 12 else ""))
    if any("shortcut" in u or "_shortcut" in u for u in unused):
      lines.append("  Hint: Model Garden's ResNet-18/34 project the first shortcut of every "
                   "stage; build ours with project_first_shortcut: true "
                   "(RetinaNet: backbone_project_first_shortcut: true).")
    raise ModelGardenMismatchError("\n".join(lines))
  for variable, value in assignments:
    variable.assign(value.astype(variable.dtype.as_numpy_dtype
                                 if hasattr(variable.dtype, "as_numpy_dtype") else variable.dtype))
  return MigrationReport(family=family, checkpoint=checkpoint.path, loaded=loaded)


def family_of(model_name: str) -> str:
  """The Model Garden family of one of our registered model names."""
  if model_name.startswith("retinanet"):
    return "retinanet"
  if model_name.startswith("resnet"):
    return "resnet"
  if model_name.startswith("transformer") and not model_name.startswith("transformer_lm"):
    return "transformer"
  raise ConfigError(f"No Model Garden checkpoint family for model {model_name!r}; supported: "
                    f"resnet*, retinanet*, transformer (encoder-decoder).")


def convert_model_garden_checkpoint(config, checkpoint_path: str, output_dir: str, *,
                                    family: Optional[str] = None, drop_background: bool = True,
                                    say: Callable[[str], None] = print) -> str:
  """Writes a model_dir of ours holding a Model Garden checkpoint's weights.

  The output is what `tpu-models train` writes at step 0: `ckpt-0` (model,
  optimizer in its initial state, step, and the weights by variable path) and
  `config.yaml`, plus `model_garden_migration.json` (the report). So
  `tpu-models evaluate/export CONFIG --model-dir OUTPUT_DIR` read it as it is,
  `tpu-models train` there continues from it, and `trainer.init_checkpoint:
  OUTPUT_DIR` warm-starts another run.

  Args:
    config: an `ExperimentConfig` or the path of an experiment YAML.
    checkpoint_path: the Model Garden checkpoint (prefix or directory).
    output_dir: the new model_dir; must not hold checkpoints yet.
    family: None = from config.task.model.name (`family_of`).
    drop_background: see `load_model_garden_checkpoint`.
    say: where progress lines go.

  Returns:
    The path of the written checkpoint.
  """
  from tpu_models import config as config_lib
  from tpu_models.training import checkpoints
  from tpu_models.training.trainer import Trainer
  if isinstance(config, str):
    config = config_lib.load_config(config)
  family = family or family_of(config.task.model.name)
  if checkpoints.find_resume(output_dir).path or checkpoints.list_checkpoints(output_dir):
    raise ConfigError(f"Output directory {output_dir!r} already holds checkpoints; choose a "
                      f"new one.")
  os.makedirs(output_dir, exist_ok=True)
  trainer = Trainer(config, output_dir)
  try:
    report = load_model_garden_checkpoint(trainer.model, checkpoint_path, family,
                                          drop_background=drop_background)
    config_lib.dump_config(config, os.path.join(output_dir, "config.yaml"))
    path = trainer.save_checkpoint()
  finally:
    trainer.close()
  with open(os.path.join(output_dir, "model_garden_migration.json"), "w") as f:
    json.dump(report.to_json(), f, indent=1)
  say(report.summary())
  say(f"Wrote {path} (and config.yaml): tpu-models evaluate/export CONFIG --model-dir "
      f"{output_dir}, or trainer.init_checkpoint: {output_dir}.")
  return path
