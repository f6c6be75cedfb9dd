"""tpu_models/layers/blocks.py: the encoder and decoder layers both families build on."""

import numpy as np
import tensorflow as tf

from tpu_models.layers import attention
from tpu_models.layers.blocks import DecoderLayer, EncoderLayer

KWARGS = dict(hidden_size=8, num_heads=2, filter_size=16, dropout=0.0, attention_dropout=0.0,
              activation_dropout=0.0, activation="relu", pre_layer_norm=True)


def test_an_encoder_layer_is_not_a_decoder_layer_and_keeps_the_variable_paths():
  encoder = EncoderLayer(**KWARGS, name="encoder_layer_0")
  encoder.build()
  assert not isinstance(encoder, DecoderLayer)
  assert [v.path for v in encoder.weights] == [
      "encoder_layer_0/self_attention/qkv_kernel", "encoder_layer_0/self_attention/output_kernel",
      "encoder_layer_0/self_attention_norm/gamma", "encoder_layer_0/self_attention_norm/beta",
      "encoder_layer_0/ffn/inner_kernel", "encoder_layer_0/ffn/inner_bias",
      "encoder_layer_0/ffn/outer_kernel", "encoder_layer_0/ffn/outer_bias",
      "encoder_layer_0/ffn_norm/gamma", "encoder_layer_0/ffn_norm/beta"]


def test_an_encoder_layer_computes_what_a_decoder_layer_without_cross_attention_does():
  encoder = EncoderLayer(**KWARGS)
  decoder = DecoderLayer(**KWARGS, cross_attention=False)
  encoder.build()
  decoder.build()
  assert len(encoder.weights) == len(decoder.weights)
  for mine, theirs in zip(encoder.weights, decoder.weights):
    theirs.assign(mine)
  x = tf.random.stateless_normal([2, 5, 8], seed=[1, 2])
  bias = attention.mask_to_bias(attention.padding_mask(tf.constant([[3, 4, 5, 0, 0],
                                                                    [6, 7, 0, 0, 0]])))
  np.testing.assert_allclose(encoder(x, bias).numpy(), decoder(x, bias).numpy(), rtol=1e-6)
