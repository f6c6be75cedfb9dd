"""TF Model Garden `Seq2SeqTransformer` (translation task) checkpoints -> our Transformer.

    name, params = model_params(mg_model_config)
    model = create_model(name, **params)
    load_weights(model, "/ckpts/wmt_transformer/ckpt-N", "model_garden")   # tpu_models.weights

Model Garden's attention is Keras MultiHeadAttention: query/key/value kernels
[d, heads, depth] and an output kernel [heads, depth, d], no biases
(use_bias=False). Ours keeps [d, d] matrices (heads contiguous in the columns,
the same order) with Q, K and V fused into one [d, 3d] kernel and the
cross-attention's K and V into one [d, 2d] kernel.
"""

import re
from typing import Any, Dict, Mapping, Tuple

import numpy as np

from tpu_models.errors import ConfigError
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import NameMap, Source

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
# Encoder-decoder models this importer serves (not the decoder-only LMs).
_MODELS = ("transformer", "transformer_tiny", "transformer_base", "transformer_big")


def _fuse_columns(*kernels: np.ndarray) -> np.ndarray:
  """[d, heads, depth] kernels -> one [d, n * heads * depth] kernel (Q | K | V)."""
  return np.concatenate([k.reshape(k.shape[0], -1) for k in kernels], axis=1)


def _attention_sources(ours: str, theirs: str, cross: bool) -> NameMap:
  q, k, v, o = (f"{theirs}/_{name}_dense/kernel" for name in ("query", "key", "value", "output"))
  out = NameMap({f"{ours}/output_kernel": Source(
      (o,), lambda x: x.reshape(-1, x.shape[-1]), "[heads, depth, d] -> [d, d]")})
  if cross:
    out[f"{ours}/query_kernel"] = Source(
        (q,), lambda x: x.reshape(x.shape[0], -1), "[d, heads, depth] -> [d, d]")
    out[f"{ours}/key_value_kernel"] = Source(
        (k,), _fuse_columns, "key | value fused into [d, 2d]", extra=((v,),))
  else:
    out[f"{ours}/qkv_kernel"] = Source(
        (q,), _fuse_columns, "query | key | value fused into [d, 3d]", extra=((k,), (v,)))
  return out


@register_importer("model_garden", "transformer", models=_MODELS, store_format="object_graph",
                   description="Model Garden Seq2SeqTransformer (translation) checkpoint")
def transformer_name_map(model, store=None) -> NameMap:
  """Our encoder-decoder Transformer -> Model Garden's Seq2SeqTransformer.

  {root}/shared_embedding/embeddings   model/embedding_lookup/embeddings (one matrix:
                                       source, target and softmax, as ours with
                                       share_embeddings)
  encoder_layer_{i}/...                model/encoder_layer/encoder_layers/{i}/...
  decoder_layer_{i}/...                model/decoder_layer/decoder_layers/{i}/...
  encoder_norm, decoder_norm           {encoder,decoder}_layer/output_normalization
  Within a layer see _MG_ENCODER_LAYER / _MG_DECODER_LAYER; attention kernels
  are reshaped and fused (`_attention_sources`). {root} is the model's name.
  """
  root = model.name
  our_paths = [v.path for v in model.variables]
  name_map = NameMap({f"{root}/shared_embedding/embeddings":
                      Source(("model/embedding_lookup/embeddings",))})
  for stack, table in (("encoder", _MG_ENCODER_LAYER), ("decoder", _MG_DECODER_LAYER)):
    for name in ("gamma", "beta"):
      name_map[f"{root}/{stack}_norm/{name}"] = Source(
          (f"model/{stack}_layer/output_normalization/{name}",))
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
          for name in ("gamma", "beta"):
            name_map[f"{ours_layer}/{ours}/{name}"] = Source(
                (f"{theirs_layer}/{theirs}/{name}",))
        else:  # ffn/inner, ffn/outer: our inner_kernel / inner_bias.
          for name in ("kernel", "bias"):
            name_map[f"{ours_layer}/{ours}_{name}"] = Source((f"{theirs_layer}/{theirs}/{name}",))
  return name_map


# ----------------------------------------------------------------------------
# Our model config for a Model Garden model config (the parity check against Model
# Garden's outputs: tests/helpers/model_garden_parity.py).


def model_params(mg: Mapping[str, Any]) -> Tuple[str, Dict[str, Any]]:
  """(registered model name, builder kwargs) of our Transformer equal to Model Garden's.

  `mg`: the translation task's ModelConfig as a dict, plus "vocab_size".
  """
  encoder, decoder = mg["encoder"], mg["decoder"]
  for key in ("num_attention_heads", "intermediate_size", "activation", "norm_first"):
    if encoder[key] != decoder[key]:
      raise ConfigError(f"Model Garden encoder and decoder differ in {key} ({encoder[key]} vs "
                        f"{decoder[key]}); our Transformer uses one value for both.")
  if encoder.get("use_bias") or abs(float(encoder.get("norm_epsilon", 1e-6)) - 1e-6) > 1e-12:
    raise ConfigError("Only Model Garden's translation defaults use_bias=False and "
                      "norm_epsilon=1e-6 map onto our Transformer.")
  if not encoder["norm_first"]:
    # Model Garden's post-LN stacks still end with a LayerNorm; ours (the paper's) do not.
    raise ConfigError("Model Garden's Transformer with norm_first=False (post-LN plus a final "
                      "LayerNorm per stack) has no equivalent here; norm_first=True maps "
                      "onto our pre_layer_norm=True.")
  return "transformer", {
      "vocab_size": int(mg["vocab_size"]),
      "num_encoder_layers": int(encoder["num_layers"]),
      "num_decoder_layers": int(decoder["num_layers"]),
      "hidden_size": int(mg["embedding_width"]),
      "num_heads": int(encoder["num_attention_heads"]),
      "filter_size": int(encoder["intermediate_size"]),
      "activation": encoder["activation"],
      "pre_layer_norm": bool(encoder["norm_first"]),
      "share_embeddings": True,
  }
