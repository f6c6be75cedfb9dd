"""Transformer (Vaswani et al. 2017): encoder-decoder for translation, decoder-only LM.

Registered builders (keyword arguments are the model config; `vocab_size` is
required):

  transformer          encoder-decoder with every knob (defaults = base).
  transformer_tiny     d 256, 3+3 layers, 4 heads, FFN 1024 (2 CPU cores).
  transformer_base     d 512, 6+6 layers, 8 heads, FFN 2048, dropout 0.1.
  transformer_big      d 1024, 6+6 layers, 16 heads, FFN 4096, dropout 0.3.
  transformer_lm       decoder-only language model with every knob.
  transformer_lm_tiny  d 256, 4 layers, 4 heads, FFN 1024.
  transformer_lm_small d 512, 6 layers, 8 heads, FFN 2048.

The models are `seq2seq.TransformerModel` and `causal_lm.TransformerLM` (on
`model_base.TransformerBase`), their blocks `tpu_models/layers/` (attention,
feed-forward, EncoderLayer, DecoderLayer), decoding's token choice `sampling.py`.

Vocabulary convention: id 0 is padding and also the decoder's start token
(there is no BOS), id 1 is EOS, id 2 UNK.

    model = create_model("transformer_base", vocab_size=32000)
    logits = model({"inputs": src, "targets": tgt}, training=True)   # [B, T, V] f32
    out = model.translate(src, beam_size=4, alpha=0.6)  # {"ids": [B, L], "scores": [B]}

    lm = create_model("transformer_lm_tiny", vocab_size=8000)
    logits = lm({"targets": ids})                        # [B, T, V] float32
    ids = lm.generate(prompt, max_new_tokens=20)         # [B, P + 20] int32

Features (int32, 0 = padding): "inputs" [B, S] and "targets" [B, T] (ids
ending in EOS). logits[:, t] predicts targets[:, t]: the decoder reads the
targets shifted right by one with 0 as the start token. Packed rows (several
examples per row) add "inputs_segment_ids", "targets_segment_ids" (1, 2, ...
per example, 0 = padding) and optionally "inputs_positions",
"targets_positions" (the position inside each example); then attention never
crosses examples, target example n attends to input example n, the shift
restarts at every example, and each example gets the logits it would get
alone.

Architecture (Tensor2Tensor / Model Garden `Seq2SeqTransformer`):
embeddings N(0, d^-1/2) scaled by sqrt(d), encoder padding embeddings zeroed;
sinusoidal positions (sin on the first half of the channels, cos on the
second); attention projections without bias; FFN dense -> activation ->
dense with biases; LayerNorm epsilon 1e-6. `pre_layer_norm=True` (default, the
current reference recipes) normalises each sublayer's input and each stack's
output; False is the paper's post-LN (normalise after each residual add, no
final norm). With `share_embeddings` one [V, d] matrix is the source
embedding, the target embedding and the softmax weights (logits = x E^T);
otherwise there are three matrices. Dropout: `dropout` on the embeddings and
on each sublayer output before its residual add, `attention_dropout` on the
attention probabilities, `activation_dropout` after the FFN activation.

Variables have fixed paths ("transformer/encoder_layer_0/self_attention/
qkv_kernel", ...). Self-attention keeps Q, K and V in one [d, 3d] kernel
(columns: Q | K | V, heads contiguous inside each); cross-attention has a
[d, d] query and a [d, 2d] key_value kernel (K | V). A Model Garden
[d, heads, depth] kernel is this matrix's block reshaped to [d, d].

Mixed precision: layers compute in the policy's compute dtype (bfloat16 /
float16); the attention softmax, LayerNorm statistics and the logits are
float32. LayerNorm and GELU are Keras' in value, with hand-written gradients
(tpu_models/layers/fused.py: the step of a small model is bound by elementwise passes).

Decoding (`translate`, `generate`) is pure TF with static shapes: a
pre-allocated key/value cache [batch, heads, max_length, depth] per layer,
written one position per step with a select, and padded outputs. Both compile
inside `tf.function(jit_compile=True)` (eval steps, serving signatures).
"""

import dataclasses
import inspect
from typing import Annotated, Dict

from tpu_models.config import SIZE
from tpu_models.builders import preset
from tpu_models.registry import register_model
from tpu_models.text.causal_lm import TransformerLM
from tpu_models.text.model_base import TransformerConfig
from tpu_models.text.seq2seq import TransformerModel

__all__ = ["TransformerConfig", "TransformerLM", "TransformerModel", "transformer",
           "transformer_base", "transformer_big", "transformer_lm", "transformer_lm_small",
           "transformer_lm_tiny", "transformer_tiny"]


def _builder(model_class, name: str, depths: Dict[str, int], doc: str):
  """The registered builder `name` of `model_class`; see `transformer` and `transformer_lm`.

  Its keyword arguments (the model config's schema, in its signature and
  annotations) are vocab_size, the stack `depths` (with their defaults), the
  other `TransformerConfig` fields and the model name.
  """
  keyword = inspect.Parameter.KEYWORD_ONLY
  fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
  parameters = [inspect.Parameter("vocab_size", keyword, annotation=Annotated[int, SIZE])]
  parameters += [inspect.Parameter(k, keyword, default=v, annotation=Annotated[int, SIZE])
                 for k, v in depths.items()]
  parameters += [inspect.Parameter(f.name, keyword, default=f.default, annotation=f.type)
                 for f in fields.values() if f.name != "vocab_size"]
  parameters.append(inspect.Parameter("name", keyword, default=name, annotation=str))
  signature = inspect.Signature(parameters, return_annotation=model_class)

  def build(**kwargs):
    arguments = signature.bind(**kwargs)
    arguments.apply_defaults()
    values = dict(arguments.arguments)
    architecture = TransformerConfig(**{k: values[k] for k in fields})
    return model_class(architecture, **{k: values[k] for k in depths}, name=values["name"])

  build.__signature__ = signature
  build.__annotations__ = {**{p.name: p.annotation for p in parameters}, "return": model_class}
  build.__name__ = build.__qualname__ = name
  build.__doc__ = doc
  return register_model(name)(build)


transformer = _builder(TransformerModel, "transformer",
                       {"num_encoder_layers": 6, "num_decoder_layers": 6}, """\
Builds an encoder-decoder Transformer (defaults: the base size).

  Args:
    vocab_size, ..., max_length: the architecture (`TransformerConfig`).
    num_encoder_layers, num_decoder_layers: stack depths.
    name: model name (the root of the variable paths).

  Returns:
    A built `TransformerModel`.
  """)

transformer_lm = _builder(TransformerLM, "transformer_lm", {"num_layers": 6}, """\
Builds a decoder-only Transformer language model.

  Args: as `transformer` (one stack of `num_layers` decoder layers without
  cross-attention; `share_embeddings` ties the input embedding and the
  softmax; `max_length` caps prompt + generated tokens).

  Returns:
    A built `TransformerLM`.
  """)


def _preset(builder, name: str, **defaults):
  """`builder` with new defaults, registered as `name`; its signature shows them."""
  return register_model(name)(preset(builder, name, defaults={**defaults, "name": name}))


transformer_tiny = _preset(transformer, "transformer_tiny", num_encoder_layers=3,
                           num_decoder_layers=3, hidden_size=256, num_heads=4, filter_size=1024)
transformer_base = _preset(transformer, "transformer_base")
transformer_big = _preset(transformer, "transformer_big", hidden_size=1024, num_heads=16,
                          filter_size=4096, dropout=0.3)
transformer_lm_tiny = _preset(transformer_lm, "transformer_lm_tiny", num_layers=4,
                              hidden_size=256, num_heads=4, filter_size=1024)
transformer_lm_small = _preset(transformer_lm, "transformer_lm_small", num_layers=6,
                               hidden_size=512, num_heads=8, filter_size=2048)
