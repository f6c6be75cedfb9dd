"""Model Garden side of the checkpoint-migration parity check; writes files only.

Runs INSIDE benchmarks/.venv-model-garden (tf-models-official, Keras 2), never
in the main environment. For one family it builds the Model Garden model with
random weights (no downloads), saves its checkpoint exactly as Model Garden's
trainer does (`official.core.base_trainer.Trainer`: global_step, model,
optimizer and the model's `checkpoint_items`), and writes the model's outputs
on a fixed input to `outputs.npz`, plus `model_garden.json` (the Model Garden
config used and what was measured):

  resnet       `resnet_imagenet` ClassificationModel: logits [B, classes].
  retinanet    `retinanet_resnetfpn_coco` RetinaNetModel: raw cls/box outputs per
               level (cls_l3 ... [B, H, W, A * K]), anchors per level, and the
               detections of its own generator (NMS v2) on the same images.
  maskrcnn     `maskrcnn_resnetfpn_coco` MaskRCNNModel at inference: raw RPN
               outputs per level (rpn_scores_l2 ... [B, H, W, A], rpn_boxes_l*),
               anchors per level, the proposals of its MultilevelROIGenerator
               (rois [B, R, 4]), its DetectionHead's outputs on them
               (class_outputs [B, R, K + 1], box_outputs [B, R, 4(K + 1)]), and
               its DetectionGenerator's detections and their masks
               (detection_masks [B, D, 28, 28]); on photos (`--images`).
  transformer  `Seq2SeqTransformer` (the translation task's): teacher-forced
               logits [B, T, V] and beam-search ids/scores.

Every variable is randomised (BN statistics and biases included: zero or one
initial values would hide a mapping mistake). Usage:

    benchmarks/.venv-model-garden/bin/python benchmarks/model_garden/migration_worker.py \\
        --family retinanet --output /tmp/mg_retinanet --depth 50 --image-size 256
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras  # pylint: disable=g-import-not-at-top

from official.core import exp_factory  # pylint: disable=g-import-not-at-top
from official.vision import registry_imports  # pylint: disable=unused-import,g-import-not-at-top
from official.vision.modeling import factory  # pylint: disable=g-import-not-at-top


def randomize(model, seed: int, bias_mean: dict = None, fan_in_scaled=()) -> None:
  """Gives every variable a random value of a sensible scale (deterministic in `seed`).

  Kernels keep Model Garden's own (random) initial values, rescaled by a random
  factor per variable; BN statistics and affine parameters, biases and
  embeddings are drawn around their neutral values. `bias_mean` maps a variable
  name fragment to the mean of its bias (the RetinaNet classifier's, so that
  detections pass the score threshold); kernels whose name contains one of
  `fan_in_scaled` are redrawn N(0, 1 / fan_in).
  """
  rng = np.random.default_rng(seed)
  for variable in model.variables:
    name, shape = variable.name, variable.shape
    if "moving_variance" in name:
      value = rng.uniform(0.5, 1.5, shape)
    elif "moving_mean" in name or "beta" in name:
      value = rng.normal(0.0, 0.1, shape)
    elif "gamma" in name:
      value = rng.uniform(0.7, 1.3, shape)
    elif name.endswith("bias:0"):
      mean = next((m for key, m in (bias_mean or {}).items() if key in name), 0.0)
      value = rng.normal(mean, 0.1, shape)
    elif any(key in name for key in (fan_in_scaled or ())):
      # LeCun-normal. Model Garden's RetinaNet head initialisers (sigma 0.01, classifier 1e-5)
      # make the head's outputs nearly constant over positions: scores would tie.
      value = rng.normal(0.0, 1.0 / np.sqrt(np.prod(shape[:-1])), shape)
    else:
      value = variable.numpy() * rng.uniform(0.8, 1.2)
    variable.assign(value.astype(variable.dtype.as_numpy_dtype))


def save_like_model_garden(model, output_dir: str) -> str:
  """The checkpoint `base_trainer.Trainer` writes: global_step, model, optimizer, checkpoint_items."""
  global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
  optimizer = tf_keras.optimizers.SGD(0.1, momentum=0.9)
  items = getattr(model, "checkpoint_items", {}) or {}
  checkpoint = tf.train.Checkpoint(global_step=global_step, model=model, optimizer=optimizer,
                                   **items)
  manager = tf.train.CheckpointManager(checkpoint, output_dir, max_to_keep=1)
  return manager.save(checkpoint_number=0)


def images(batch: int, size: int, seed: int) -> np.ndarray:
  """Random 8-bit pixels, normalised to about [-2, 2] (exact in float32; compresses well)."""
  pixels = np.random.default_rng(seed).integers(0, 256, (batch, size, size, 3))
  return ((pixels - 128.0) / 64.0).astype(np.float32)


def vision_model_config(experiment: str, args):
  """The model config of a registered vision experiment at the flags' classes, input size
  and ResNet backbone (`--depth`, `--width` = 64 x Model Garden's depth_multiplier)."""
  model_config = exp_factory.get_exp_config(experiment).task.model
  model_config.num_classes = args.num_classes
  model_config.input_size = [args.image_size, args.image_size, 3]
  model_config.backbone.resnet.model_id = args.depth
  model_config.backbone.resnet.depth_multiplier = args.width / 64.0
  return model_config


def input_spec(args):
  return tf_keras.layers.InputSpec(shape=[None, args.image_size, args.image_size, 3])


def run_resnet(args) -> dict:
  model_config = vision_model_config("resnet_imagenet", args)
  model = factory.build_classification_model(input_spec(args), model_config)
  randomize(model, args.seed)
  x = images(args.batch, args.image_size, args.seed + 1)
  logits = model(x, training=False).numpy()
  path = save_like_model_garden(model, args.output)
  return {"checkpoint": path, "model_config": model_config.as_dict(),
          "arrays": {"images": x, "logits": logits}}


def run_retinanet(args) -> dict:
  mc = vision_model_config("retinanet_resnetfpn_coco", args)
  mc.decoder.fpn.num_filters = args.fpn_channels
  mc.head.num_filters = args.fpn_channels
  mc.head.num_convs = args.head_convs
  model = factory.build_retinanet(input_spec(args), mc)
  # Classifier biases near -2 (score ~0.12) so that detections pass the 0.05 threshold.
  # Every kernel LeCun-normal: with Model Garden's initialisers and random BN statistics
  # the activations of a ResNet-50 backbone grow so large that the boxes degenerate and
  # the scores saturate (ties, whose NMS order is implementation-defined).
  randomize(model, args.seed, bias_mean={"scores": -2.0}, fan_in_scaled=("",))
  x = images(args.batch, args.image_size, args.seed + 1)
  image_shape = tf.constant([[args.image_size, args.image_size]] * args.batch, tf.float32)
  out = model(x, image_shape=image_shape, training=False)
  arrays = {"images": x}
  for level in range(mc.min_level, mc.max_level + 1):
    arrays[f"cls_l{level}"] = out["cls_outputs"][str(level)].numpy()
    arrays[f"box_l{level}"] = out["box_outputs"][str(level)].numpy()
  from official.vision.ops import anchor  # pylint: disable=g-import-not-at-top
  anchors = anchor.Anchor(min_level=mc.min_level, max_level=mc.max_level,
                          num_scales=mc.anchor.num_scales, aspect_ratios=mc.anchor.aspect_ratios,
                          anchor_size=mc.anchor.anchor_size,
                          image_size=(args.image_size, args.image_size)).multilevel_boxes
  for level, boxes in anchors.items():
    arrays[f"anchors_l{level}"] = boxes.numpy()
  for key in ("detection_boxes", "detection_scores", "detection_classes", "num_detections"):
    arrays[key] = out[key].numpy()
  path = save_like_model_garden(model, args.output)
  return {"checkpoint": path, "model_config": mc.as_dict(), "arrays": arrays}


def photos(path: str, batch: int, size: int) -> np.ndarray:
  """The first `batch` uint8 photos of an .npy [N, size, size, 3], normalised as `images`."""
  pixels = np.load(path)
  if pixels.shape[0] < batch or pixels.shape[1:] != (size, size, 3):
    raise SystemExit(f"--images {path} holds {pixels.shape}; expected at least {batch} "
                     f"images of {size}x{size}x3.")
  return ((pixels[:batch].astype(np.float64) - 128.0) / 64.0).astype(np.float32)


def run_maskrcnn(args) -> dict:
  mc = vision_model_config("maskrcnn_resnetfpn_coco", args)
  mc.decoder.fpn.num_filters = args.fpn_channels
  mc.rpn_head.num_filters = args.fpn_channels
  mc.detection_head.num_filters = args.fpn_channels
  mc.detection_head.num_convs = args.head_convs
  mc.detection_head.num_fcs = args.box_head_fcs
  mc.detection_head.fc_dims = args.fc_dims
  mc.mask_head.num_filters = args.mask_head_channels
  mc.mask_head.num_convs = args.mask_head_convs
  mc.roi_generator.test_num_proposals = args.proposals
  mc.roi_generator.test_pre_nms_top_k = args.rpn_pre_nms_top_k
  mc.detection_generator.max_num_detections = args.max_detections
  mc.norm_activation.use_sync_bn = False  # One CPU; the same layers unsynchronised.
  model = factory.build_maskrcnn(input_spec(args), mc)
  x = (photos(args.images, args.batch, args.image_size) if args.images
       else images(args.batch, args.image_size, args.seed + 1))
  size = args.image_size
  image_shape = tf.constant([[size, size]] * args.batch, tf.float32)
  model(x, image_shape=image_shape, training=False)  # Builds the heads' variables.
  # Every kernel LeCun-normal (as RetinaNet's, so activations stay in range); the
  # box regressors' kernels a tenth of that (deltas ~0.1-0.5: boxes near their anchors
  # and proposals, not stretched to the image edges), and the detection classifier's
  # background bias 3 lower, so that real classes pass the generator's 0.05 threshold.
  randomize(model, args.seed, fan_in_scaled=("",))
  for variable in model.variables:
    if "rpn-boxes/kernel" in variable.name or "detection-boxes/kernel" in variable.name:
      variable.assign(variable * 0.1)
    if "detection-scores/bias" in variable.name:
      variable.assign(variable - tf.one_hot(0, variable.shape[0]) * 3.0)
  out = model(x, image_shape=image_shape, training=False)
  arrays = {"images": x}
  from official.vision.ops import anchor  # pylint: disable=g-import-not-at-top
  anchors = anchor.Anchor(min_level=mc.min_level, max_level=mc.max_level,
                          num_scales=mc.anchor.num_scales, aspect_ratios=mc.anchor.aspect_ratios,
                          anchor_size=mc.anchor.anchor_size,
                          image_size=(size, size)).multilevel_boxes
  for level in range(mc.min_level, mc.max_level + 1):
    arrays[f"rpn_scores_l{level}"] = out["rpn_scores"][str(level)].numpy()
    arrays[f"rpn_boxes_l{level}"] = out["rpn_boxes"][str(level)].numpy()
    arrays[f"anchors_l{level}"] = anchors[str(level)].numpy()
  # The proposals the model's own call made (the generator is deterministic).
  tiled = {level: tf.tile(boxes[None], [args.batch, 1, 1, 1]) for level, boxes in anchors.items()}
  rois, roi_scores = model.roi_generator(out["rpn_boxes"], out["rpn_scores"], tiled, image_shape,
                                         False)
  arrays["rois"], arrays["roi_scores"] = rois.numpy(), roi_scores.numpy()
  arrays["class_outputs"] = out["cls_outputs"].numpy()
  arrays["box_outputs"] = out["box_outputs"].numpy()
  for key in ("detection_boxes", "detection_scores", "detection_classes", "num_detections",
              "detection_masks"):
    arrays[key] = out[key].numpy()
  path = save_like_model_garden(model, args.output)
  return {"checkpoint": path, "model_config": mc.as_dict(), "arrays": arrays}


def run_transformer(args) -> dict:
  # The translation task's model (official/nlp/tasks/translation.py build_model with
  # its ModelConfig/EncDecoder defaults), built here without importing the task,
  # whose module needs tensorflow_hub and a SentencePiece model.
  from official.nlp.modeling.models import seq2seq_transformer  # pylint: disable=g-import-not-at-top
  layer = dict(num_layers=args.num_layers, num_attention_heads=args.num_heads,
               intermediate_size=args.filter_size, activation="relu", dropout_rate=0.1,
               attention_dropout_rate=0.1, intermediate_dropout=0.1, use_bias=False,
               norm_first=True, norm_epsilon=1e-6)
  mc = {"encoder": layer, "decoder": layer, "embedding_width": args.hidden_size,
        "dropout_rate": 0.1, "padded_decode": False, "decode_max_length": None,
        "beam_size": args.beam_size, "alpha": args.alpha}
  model = seq2seq_transformer.Seq2SeqTransformer(
      vocab_size=args.vocab_size, embedding_width=args.hidden_size, dropout_rate=0.1,
      padded_decode=False, decode_max_length=None, extra_decode_length=args.extra_decode_length,
      beam_size=args.beam_size, alpha=args.alpha,
      encoder_layer=seq2seq_transformer.TransformerEncoder(**layer),
      decoder_layer=seq2seq_transformer.TransformerDecoder(**layer), eos_id=1)
  rng = np.random.default_rng(args.seed + 1)
  batch, source_length, target_length = args.batch, args.source_length, args.target_length
  sources = rng.integers(3, args.vocab_size, (batch, source_length)).astype(np.int32)
  targets = rng.integers(3, args.vocab_size, (batch, target_length)).astype(np.int32)
  # Padding (0) at the end of the second rows, EOS (1) ending each real sequence.
  sources[1:, source_length - 3:] = 0
  sources[1:, source_length - 4] = 1
  sources[0, -1] = 1
  targets[1:, target_length - 2:] = 0
  targets[1:, target_length - 3] = 1
  targets[0, -1] = 1
  model({"inputs": sources, "targets": targets})  # Builds the variables.
  randomize(model, args.seed)
  logits = model({"inputs": sources, "targets": targets}).numpy()
  decoded = model({"inputs": sources})
  path = save_like_model_garden(model, args.output)
  config = dict(mc)
  config.update(vocab_size=args.vocab_size, extra_decode_length=args.extra_decode_length)
  return {"checkpoint": path, "model_config": config,
          "arrays": {"sources": sources, "targets": targets, "logits": logits,
                     "beam_ids": decoded["outputs"].numpy(),
                     "beam_scores": decoded["scores"].numpy(),
                     "beam_size": np.array(args.beam_size), "alpha": np.array(args.alpha)}}


FAMILIES = {"resnet": run_resnet, "retinanet": run_retinanet, "maskrcnn": run_maskrcnn,
            "transformer": run_transformer}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
  parser.add_argument("--output", required=True, help="directory for the checkpoint and outputs")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--batch", type=int, default=2)
  # ResNet / RetinaNet.
  parser.add_argument("--depth", type=int, default=50, help="ResNet model_id")
  parser.add_argument("--width", type=int, default=64,
                      help="stem/stage-2 channels (Model Garden depth_multiplier = width / 64)")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--num-classes", type=int, default=1000,
                      help="Model Garden num_classes (RetinaNet: including background 0)")
  parser.add_argument("--fpn-channels", type=int, default=256)
  parser.add_argument("--head-convs", type=int, default=4,
                      help="RetinaNet head / Mask R-CNN detection head convs")
  # Mask R-CNN (defaults: maskrcnn_resnetfpn_coco's).
  parser.add_argument("--box-head-fcs", type=int, default=1)
  parser.add_argument("--fc-dims", type=int, default=1024)
  parser.add_argument("--mask-head-convs", type=int, default=4)
  parser.add_argument("--mask-head-channels", type=int, default=256)
  parser.add_argument("--proposals", type=int, default=1000, help="test_num_proposals")
  parser.add_argument("--rpn-pre-nms-top-k", type=int, default=1000, help="test_pre_nms_top_k")
  parser.add_argument("--max-detections", type=int, default=100)
  parser.add_argument("--images", default="",
                      help="Mask R-CNN: .npy of uint8 photos [N, S, S, 3] (default random pixels)")
  # Transformer (Transformer-base; the inputs' lengths and the beam search).
  for flag, default in (("--vocab-size", 33708), ("--hidden-size", 512), ("--num-layers", 6),
                        ("--num-heads", 8), ("--filter-size", 2048), ("--source-length", 12),
                        ("--target-length", 10), ("--beam-size", 4),
                        ("--extra-decode-length", 8)):
    parser.add_argument(flag, type=int, default=default)
  parser.add_argument("--alpha", type=float, default=0.6)
  args = parser.parse_args()

  os.makedirs(args.output, exist_ok=True)
  tf.random.set_seed(args.seed)
  tf_keras.utils.set_random_seed(args.seed)
  result = FAMILIES[args.family](args)
  np.savez_compressed(os.path.join(args.output, "outputs.npz"), **result.pop("arrays"))
  result["checkpoint"] = os.path.basename(result["checkpoint"])
  result["args"] = {k: v for k, v in vars(args).items() if k != "output"}
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  result["versions"] = {"tf-models-official": importlib.metadata.version("tf-models-official"),
                        "tensorflow": tf.__version__}
  with open(os.path.join(args.output, "model_garden.json"), "w") as f:
    json.dump(result, f, indent=1, default=str)
  print(json.dumps({"family": args.family, "checkpoint": result["checkpoint"]}))


if __name__ == "__main__":
  main()
