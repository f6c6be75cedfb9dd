"""Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words").

Registered builders: `vit` (every knob: patch size, width, depth, heads, MLP
width) and `vit_s16`, `vit_b16`, `vit_l16` (the paper's and DeiT's sizes with
16 px patches). Their keyword arguments are the model config:

    model = create_model("vit_b16", num_classes=1000)          # 224 px, 86.6M
    small = create_model("vit", patch_size=4, hidden_size=128, num_layers=6,
                         num_heads=4, mlp_dim=512, num_classes=10,
                         input_shape=[28, 28, 1])               # Fashion-MNIST
    logits = model(images, training=True)  # [B, num_classes] float32

The network, top to bottom:

  patch embedding  a conv with kernel = stride = patch_size: [B, H, W, C] ->
                   [B, H/p, W/p, d], one token per patch.
  embeddings       a learned class token in front (pooling "token") and
                   learned position embeddings added, [1, 1 + N, d] (the class
                   token's row first) or [1, N, d] (pooling "gap"). When the
                   patch grid differs from the grid the embeddings were trained
                   at (`position_grid`), the grid rows are resized bilinearly at
                   every call and the class token's row is kept; to resize them
                   once in a checkpoint instead, use `resize_position_embeddings`.
  encoder          `num_layers` pre-LN blocks x + MHA(LN(x)), x + MLP(LN(x)): the
                   shared `EncoderLayer` (tpu_models/layers/blocks.py) with
                   biased attention projections, GELU and
                   no attention mask (every patch sees every patch).
  encoder_norm     the final LayerNorm (epsilon 1e-6, as the encoder's).
  head             the class token's output (or the mean of all tokens, "gap"),
                   then a zero-initialised classifier "logits" (big_vision's
                   head_zeroinit: the model starts at uniform predictions).

Initialisation follows big_vision's ViT: LeCun-normal patch embedding, class
token zeros, position embeddings N(0, 1/d), Glorot-uniform attention and MLP
kernels, zero biases. Variable paths are fixed ("patch_embedding/kernel",
"embeddings/class_token", "embeddings/position_embeddings",
"encoder_layer_0/self_attention/qkv_kernel", ..., "encoder_norm/gamma",
"logits/kernel"); Q, K and V share one [d, 3d] kernel (columns Q | K | V,
heads contiguous inside each), as in the Transformer.

Mixed precision: the blocks compute in the policy's compute dtype with the
attention softmax and LayerNorm statistics in float32; pooling and logits are
float32.
"""

import math
from typing import Annotated, List, Optional, Sequence

import keras
import tensorflow as tf

from tpu_models.config import SIZE
from tpu_models.builders import preset
from tpu_models.errors import ConfigError
from tpu_models.registry import register_model
from tpu_models.layers.blocks import EncoderLayer, norm_layer

POOLINGS = ("token", "gap")


# ----------------------------------------------------------------------------
# Position embeddings at another resolution.


def resize_position_embeddings(embeddings, new_grid: Sequence[int],
                               num_prefix_tokens: int = 1,
                               grid: Optional[Sequence[int]] = None) -> tf.Tensor:
  """Bilinear resize of learned position embeddings to another patch grid.

  For fine-tuning at a higher resolution (Dosovitskiy et al. 2020, section
  3.2): a 224 px B/16 checkpoint has a 14x14 grid; at 384 px the model needs
  24x24. The prefix rows (the class token's) are kept as they are.

  Args:
    embeddings: [1, num_prefix_tokens + gh * gw, d] array-like (numpy, tensor
      or variable), e.g. "embeddings/position_embeddings" of a checkpoint.
    new_grid: (new_gh, new_gw), the patch grid of the new image size
      (image size // patch size).
    num_prefix_tokens: rows in front of the grid (1 with a class token, 0 for
      "gap" pooling).
    grid: (gh, gw) of `embeddings`; None = a square grid.

  Returns:
    float32 [1, num_prefix_tokens + new_gh * new_gw, d] (the input itself when
    the grids are equal).
  """
  embeddings = tf.cast(tf.convert_to_tensor(embeddings), tf.float32)
  if embeddings.shape.rank != 3 or embeddings.shape[0] != 1:
    raise ConfigError(f"Position embeddings must be [1, tokens, d], got shape {embeddings.shape}.")
  tokens, depth = embeddings.shape[1] - num_prefix_tokens, embeddings.shape[2]
  if grid is None:
    side = math.isqrt(max(tokens, 0))
    grid = (side, side)
  if tokens < 1 or grid[0] * grid[1] != tokens:
    raise ConfigError(f"Position embeddings of shape {embeddings.shape} with {num_prefix_tokens} "
                      f"prefix token(s) do not form a {grid[0]}x{grid[1]} grid.")
  new_grid = tuple(int(g) for g in new_grid)
  if tuple(grid) == new_grid:
    return embeddings
  prefix, rows = embeddings[:, :num_prefix_tokens], embeddings[:, num_prefix_tokens:]
  rows = tf.image.resize(tf.reshape(rows, [1, grid[0], grid[1], depth]), new_grid,
                         method="bilinear", antialias=False)
  return tf.concat([prefix, tf.reshape(rows, [1, new_grid[0] * new_grid[1], depth])], axis=1)


# ----------------------------------------------------------------------------
# Layers.


class PatchTokens(keras.layers.Layer):
  """Patch grid [B, h, w, d] -> tokens [B, prefix + h * w, d]: class token and positions.

  Variables: "class_token" [1, 1, d] (with `class_token`) and
  "position_embeddings" [1, prefix + gh * gw, d] for the trained grid
  `position_grid` = (gh, gw); another grid at call time is served by
  resizing the grid rows (`resize_position_embeddings`; static shapes, so it
  compiles under XLA).
  """

  def __init__(self, position_grid: Sequence[int], class_token: bool = True, **kwargs):
    super().__init__(**kwargs)
    self.position_grid = tuple(int(g) for g in position_grid)
    self.class_token = class_token
    self.num_prefix_tokens = int(class_token)

  def build(self, input_shape):
    depth = input_shape[-1]
    if self.class_token:
      self.token = self.add_weight(name="class_token", shape=(1, 1, depth), initializer="zeros")
    rows = self.num_prefix_tokens + self.position_grid[0] * self.position_grid[1]
    self.position_embeddings = self.add_weight(
        name="position_embeddings", shape=(1, rows, depth),
        initializer=keras.initializers.RandomNormal(stddev=depth ** -0.5))

  def call(self, patches: tf.Tensor) -> tf.Tensor:
    """[B, h, w, d] (compute dtype) -> [B, prefix + h * w, d]."""
    _, height, width, depth = patches.shape
    tokens = tf.reshape(patches, [-1, height * width, depth])
    if self.class_token:
      token = tf.cast(self.token, tokens.dtype)
      tokens = tf.concat([tf.tile(token, [tf.shape(tokens)[0], 1, 1]), tokens], axis=1)
    positions = resize_position_embeddings(self.position_embeddings, (height, width),
                                           self.num_prefix_tokens, self.position_grid)
    return tokens + tf.cast(positions, tokens.dtype)

  def compute_output_shape(self, input_shape):
    batch, height, width, depth = input_shape
    return (batch, self.num_prefix_tokens + height * width, depth)

  def get_config(self):
    return {**super().get_config(), "position_grid": list(self.position_grid),
            "class_token": self.class_token}


# ----------------------------------------------------------------------------
# The model.


@register_model("vit")
def vit(*,
        patch_size: Annotated[int, SIZE] = 16,
        hidden_size: Annotated[int, SIZE] = 768,
        num_layers: Annotated[int, SIZE] = 12,
        num_heads: Annotated[int, SIZE] = 12,
        mlp_dim: int = 3072,
        num_classes: Annotated[int, SIZE] = 1000,
        include_top: bool = True,
        input_shape: Optional[List[int]] = None,
        pooling: str = "token",
        position_grid: Optional[List[int]] = None,
        dropout_rate: float = 0.0,
        attention_dropout_rate: float = 0.0,
        name: Optional[str] = None) -> keras.Model:
  """Builds a Vision Transformer.

  Args:
    patch_size: side of the square patches (the patch-embedding conv's kernel
      and stride); must divide the image height and width.
    hidden_size: token width d.
    num_layers: encoder blocks.
    num_heads: attention heads (must divide hidden_size).
    mlp_dim: width of each block's MLP (GELU).
    num_classes: width of the classifier.
    include_top: True: output float32 logits [B, num_classes]. False: the
      pooled, normalised features float32 [B, hidden_size].
    input_shape: [H, W, C] of one image (static H and W: the position
      embeddings have one row per patch); None means [224, 224, 3].
    pooling: "token" (a class token, its output feeds the head; the paper's)
      or "gap" (no class token; the mean of the tokens after the final norm).
    position_grid: [gh, gw], the patch grid the position embeddings are kept
      at; None = the input's (H / patch_size, W / patch_size). Set it to the
      pretraining grid (e.g. [14, 14]) to run pretrained embeddings at another
      image size: they are resized bilinearly at each call.
    dropout_rate: dropout after the embeddings and on each block's two
      residual branches (big_vision's `dropout`); 0 adds none.
    attention_dropout_rate: dropout on the attention probabilities.
    name: model name, default "vit".

  Returns:
    A functional `keras.Model` taking float images [B, H, W, C] (any float
    dtype; cast to the policy's compute dtype).
  """
  if input_shape is None:
    input_shape = [224, 224, 3]
  if len(input_shape) != 3 or any(not isinstance(s, int) or s < 1 for s in input_shape):
    raise ConfigError(f"ViT input_shape must be [height, width, channels] of positive ints "
                      f"(static: one position embedding per patch), got {input_shape}.")
  for key, value in (("patch_size", patch_size), ("hidden_size", hidden_size),
                     ("num_layers", num_layers), ("num_heads", num_heads),
                     ("mlp_dim", mlp_dim), ("num_classes", num_classes)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"ViT {key} must be a positive int, got {value!r}.")
  height, width, _ = input_shape
  if height % patch_size or width % patch_size:
    raise ConfigError(f"ViT patch_size {patch_size} must divide the image size {height}x{width} "
                      f"(input_shape).")
  if hidden_size % num_heads:
    raise ConfigError(f"ViT hidden_size {hidden_size} must be divisible by num_heads {num_heads}.")
  if pooling not in POOLINGS:
    raise ConfigError(f"Unknown ViT pooling {pooling!r}; expected one of {', '.join(POOLINGS)}.")
  if position_grid is None:
    position_grid = [height // patch_size, width // patch_size]
  if len(position_grid) != 2 or min(position_grid) < 1:
    raise ConfigError(f"ViT position_grid must be [rows, columns] >= 1, got {position_grid}.")
  for key, rate in (("dropout_rate", dropout_rate),
                    ("attention_dropout_rate", attention_dropout_rate)):
    if not 0.0 <= rate < 1.0:
      raise ConfigError(f"ViT {key} must be in [0, 1), got {rate!r}.")

  inputs = keras.Input(shape=tuple(input_shape), name="image")
  x = keras.layers.Conv2D(hidden_size, patch_size, strides=patch_size, padding="valid",
                          kernel_initializer="lecun_normal", name="patch_embedding")(inputs)
  x = PatchTokens(position_grid, class_token=pooling == "token", name="embeddings")(x)
  if dropout_rate > 0:
    x = keras.layers.Dropout(dropout_rate, name="embeddings_dropout")(x)
  for i in range(num_layers):
    # No attention bias (mask): images have no padding tokens.
    x = EncoderLayer(hidden_size, num_heads, mlp_dim, dropout=dropout_rate,
                     attention_dropout=attention_dropout_rate, activation_dropout=0.0,
                     activation="gelu", pre_layer_norm=True, attention_bias=True,
                     name=f"encoder_layer_{i}")(x, None)
  x = norm_layer("encoder_norm")(x)
  # The head runs in float32 under mixed precision, as ResNet's.
  if pooling == "token":
    x = keras.layers.Cropping1D((0, x.shape[1] - 1), name="class_token_output",
                                dtype="float32")(x)
    x = keras.layers.Flatten(name="pooled", dtype="float32")(x)
  else:
    x = keras.layers.GlobalAveragePooling1D(name="avg_pool", dtype="float32")(x)
  name = name or "vit"
  if not include_top:
    return keras.Model(inputs, x, name=name)
  logits = keras.layers.Dense(num_classes, kernel_initializer="zeros", name="logits",
                              dtype="float32")(x)
  return keras.Model(inputs, logits, name=name)


# name -> (hidden_size, num_layers, num_heads, mlp_dim); patch 16.
_SIZES = {
    "vit_s16": (384, 12, 6, 1536),    # DeiT-S / big_vision S/16.
    "vit_b16": (768, 12, 12, 3072),   # ViT-B/16.
    "vit_l16": (1024, 24, 16, 4096),  # ViT-L/16.
}


def _fixed_size(name: str):
  hidden_size, num_layers, num_heads, mlp_dim = _SIZES[name]
  fixed = dict(patch_size=16, hidden_size=hidden_size, num_layers=num_layers,
               num_heads=num_heads, mlp_dim=mlp_dim)
  return register_model(name)(preset(
      vit, name, fixed=fixed, defaults={"name": name},
      doc=f"Builds ViT-{name[4].upper()}/16 (d {hidden_size}, {num_layers} blocks, {num_heads} "
          f"heads, MLP {mlp_dim}); arguments as `vit` (without the size arguments)."))


vit_s16 = _fixed_size("vit_s16")
vit_b16 = _fixed_size("vit_b16")
vit_l16 = _fixed_size("vit_l16")
