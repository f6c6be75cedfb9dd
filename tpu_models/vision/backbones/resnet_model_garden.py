"""TF Model Garden's ResNet backbone -> our ResNet: the name map both families use.

A Model Garden checkpoint is a TF2 object-graph checkpoint written by its
trainer: `tf.train.Checkpoint(global_step, model, optimizer, **checkpoint_items)`
(read by `tpu_models.weights.stores.ObjectGraphStore`; every path through the
object graph is accepted, so backbone-only checkpoints and trainer checkpoints
both load). Its ResNet backbone maps 1:1 onto our ResNet (resnet.py) by
object path (`resnet_backbone_name_map`); `check_resnet_options` refuses the
Model Garden ResNet options ours has no equivalent of. Model Garden's
ResNet-18/34 (`BASIC_BLOCK_DEPTHS`) project the shortcut of the first block of
every stage: ours needs `project_first_shortcut: true` for them.

The classifier importer (vision/classification/model_garden.py) and the
detectors' (vision/detection/model_garden.py) build on it.
"""

import re
from typing import Any, Mapping, Sequence, Tuple

from tpu_models.errors import ConfigError
from tpu_models.weights.mapping import NameMap, Source

BN_VARIABLES = ("gamma", "beta", "moving_mean", "moving_variance")
# Model Garden's ResNet-18/34 project the first shortcut of every stage (resnet.py's
# project_first_shortcut).
BASIC_BLOCK_DEPTHS = (18, 34)

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


def under(roots: Sequence[str], suffix: str) -> Tuple[str, ...]:
  """`suffix` under each of `roots` (candidate object paths)."""
  return tuple(f"{root}/{suffix}" for root in roots)


def layer_variables(ours: str, theirs_roots: Sequence[str], names: Sequence[str]) -> NameMap:
  """{ours/name: Source(theirs_root/name ...)} for each variable name."""
  return NameMap({f"{ours}/{name}": Source(under(theirs_roots, name)) for name in names})


def resnet_backbone_name_map(our_paths: Sequence[str], prefix: str = "",
                             roots: Sequence[str] = _BACKBONE_ROOTS) -> NameMap:
  """Our ResNet backbone variables -> Model Garden's ResNet backbone (by object path).

  Args:
    our_paths: our model's variable paths (the blocks are read from them).
    prefix: our backbone's path prefix ("" for the classifier, "backbone/" in RetinaNet).
    roots: candidate object paths of Model Garden's backbone in the checkpoint.

  Returns:
    {our variable path: Source}, with the ResNet-18/34 shortcut hint.
  """
  name_map = NameMap()
  name_map.update(layer_variables(f"{prefix}conv1", under(roots, "layer_with_weights-0"),
                                  ["kernel"]))
  name_map.update(layer_variables(f"{prefix}bn1", under(roots, "layer_with_weights-1"),
                                  BN_VARIABLES))
  blocks = sorted({(int(m.group(1)), int(m.group(2))) for path in our_paths
                   for m in [_BLOCK_RE.match(path[len(prefix):])]
                   if path.startswith(prefix) and m})
  for index, (stage, block) in enumerate(blocks, start=2):
    block_roots = under(roots, f"layer_with_weights-{index}")
    for ours, theirs in _RESNET_BLOCK_LAYERS.items():
      names = ["kernel"] if "conv" in ours else BN_VARIABLES
      name_map.update(layer_variables(f"{prefix}stage{stage}_block{block}_{ours}",
                                      under(block_roots, theirs), names))
  name_map.hints.append((
      lambda mismatch: any("_shortcut" in u for u in mismatch.unused),
      "Model Garden's ResNet-18/34 project the first shortcut of every stage; build ours "
      "with project_first_shortcut: true (RetinaNet: backbone_project_first_shortcut: true)."))
  return name_map


def check_resnet_options(resnet: Mapping[str, Any]) -> None:
  """Model Garden ResNet options our ResNet does not have (exact parity impossible)."""
  unsupported = {
      "stem_type": ("v0",), "se_ratio": (0.0, None), "resnetd_shortcut": (False,),
      "replace_stem_max_pool": (False,),
  }
  for key, allowed in unsupported.items():
    if key in resnet and resnet[key] not in allowed:
      raise ConfigError(f"Model Garden ResNet option {key}={resnet[key]!r} has no equivalent in "
                        f"tpu_models' ResNet (supported: {allowed[0]!r}).")
