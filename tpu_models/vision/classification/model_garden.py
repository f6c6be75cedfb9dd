"""TF Model Garden (tf-models-official) ResNet checkpoints -> our ResNet.

    model = create_model("resnet", **model_params(mg_model_config))
    load_weights(model, "/ckpts/resnet50/ckpt-N", "model_garden")   # tpu_models.weights

`resnet_imagenet`'s ClassificationModel maps 1:1 onto our ResNet: the backbone
by the shared map (tpu_models/vision/backbones/resnet_model_garden.py: the
checkpoint's layout, the object paths; its names are importable from here as
before), the Dense head onto `logits`.

Settings that must match for parity (they change no variable, so the checkpoint
cannot tell): `bn_epsilon` (Model Garden resnet_imagenet 1e-5: our default),
input normalisation (both models take normalised images), and for Model
Garden's ResNet-18/34 `project_first_shortcut: true` (it projects the shortcut
of the first block of every stage; checked: the import fails without it, with
a hint). `model_params` derives all of them from Model Garden's model config.
"""

from typing import Any, Dict, Mapping, Tuple

from tpu_models.vision.backbones.resnet_model_garden import (BASIC_BLOCK_DEPTHS, BN_VARIABLES,
                                                             check_resnet_options,
                                                             layer_variables,
                                                             resnet_backbone_name_map, under)
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import NameMap, Source

__all__ = ["BASIC_BLOCK_DEPTHS", "BN_VARIABLES", "check_resnet_options", "layer_variables",
           "model_params", "resnet_backbone_name_map", "resnet_name_map", "under"]


@register_importer("model_garden", "resnet", models=("resnet*",), store_format="object_graph",
                   description="Model Garden resnet_imagenet ClassificationModel checkpoint")
def resnet_name_map(model, store=None) -> NameMap:
  """The `resnet_imagenet` classifier: the backbone map, and the Dense head.

  Model Garden's ClassificationModel is functional: backbone (weighted layer
  0), global average pool, dropout, Dense (weighted layer 1) -> our `logits`.
  """
  name_map = resnet_backbone_name_map([v.path for v in model.variables])
  for name in ("kernel", "bias"):
    name_map[f"logits/{name}"] = Source((f"model/layer_with_weights-1/{name}",))
  name_map.hint_when_mismatched("logits/",
                                "the classifier has another width: a different num_classes?")
  return name_map


# ----------------------------------------------------------------------------
# Our model config for a Model Garden model config (the parity check against Model
# Garden's outputs: tests/helpers/model_garden_parity.py).


def model_params(mg: Mapping[str, Any]) -> Tuple[str, Dict[str, Any]]:
  """(registered model name, builder kwargs) of our ResNet equal to a Model Garden one.

  Args:
    mg: Model Garden's `task.model` config (ImageClassificationModel) as a
      dict (`params.task.model.as_dict()`; benchmarks/model_garden/
      migration_worker.py writes it to model_garden.json).
  """
  resnet = mg["backbone"]["resnet"]
  check_resnet_options(resnet)
  depth = int(resnet["model_id"])
  return "resnet", {
      "depth": depth, "num_classes": int(mg["num_classes"]),
      "input_shape": [int(s) for s in mg["input_size"]],
      "width": int(round(64 * float(resnet.get("depth_multiplier", 1.0)))),
      "bn_epsilon": float(mg["norm_activation"]["norm_epsilon"]),
      "bn_momentum": float(mg["norm_activation"]["norm_momentum"]),
      "project_first_shortcut": depth in BASIC_BLOCK_DEPTHS,
      "dropout_rate": float(mg.get("dropout_rate", 0.0)),
  }
