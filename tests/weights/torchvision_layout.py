"""torchvision ResNet state dicts written with numpy, and their forward pass in numpy.

Independent of our model: NCHW, PyTorch's conv/pool padding (k // 2 on every
side), BatchNorm in inference mode with epsilon 1e-5, written from the
torchvision architecture (v1.5: the stride on the 3x3 conv). Used to write
the committed fixtures (`python tests/weights/torchvision_layout.py`) and as
the reference the imported model must equal.
"""

import os
from typing import Dict

import numpy as np

BLOCKS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
          50: ("bottleneck", [3, 4, 6, 3])}
EPSILON = 1e-5
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "torchvision")
# (depth, width, num_classes) of the committed fixtures.
TINY = {"resnet18_w4.safetensors": (18, 4, 10), "resnet50_w4.safetensors": (50, 4, 10)}


def state_dict(depth: int, width: int, num_classes: int, seed: int = 0) -> Dict[str, np.ndarray]:
  """A random state dict in torchvision's exact key layout (widths scaled by width / 64)."""
  rng = np.random.default_rng(seed)
  state: Dict[str, np.ndarray] = {}

  def conv(name, out, inp, k):
    fan_in = inp * k * k
    state[f"{name}.weight"] = (rng.standard_normal((out, inp, k, k)) *
                               np.sqrt(2.0 / fan_in)).astype(np.float32)

  def bn(name, channels, last=False):
    # A small gamma on each block's last BN keeps the residual sum (and the
    # logits) of order 1, so float32 rounding stays far below the tolerance.
    low, high = (0.05, 0.3) if last else (0.5, 1.5)
    state[f"{name}.weight"] = rng.uniform(low, high, channels).astype(np.float32)
    state[f"{name}.bias"] = rng.normal(0, 0.1, channels).astype(np.float32)
    state[f"{name}.running_mean"] = rng.normal(0, 0.1, channels).astype(np.float32)
    state[f"{name}.running_var"] = rng.uniform(0.5, 1.5, channels).astype(np.float32)
    state[f"{name}.num_batches_tracked"] = np.array(100, np.int64)

  kind, blocks = BLOCKS[depth]
  expansion = 1 if kind == "basic" else 4
  conv("conv1", width, 3, 7)
  bn("bn1", width)
  channels = width
  for stage, num_blocks in enumerate(blocks):
    planes = width * 2 ** stage
    for b in range(num_blocks):
      prefix = f"layer{stage + 1}.{b}"
      stride = 2 if b == 0 and stage > 0 else 1
      if kind == "basic":
        conv(f"{prefix}.conv1", planes, channels, 3)
        bn(f"{prefix}.bn1", planes)
        conv(f"{prefix}.conv2", planes, planes, 3)
        bn(f"{prefix}.bn2", planes, last=True)
      else:
        conv(f"{prefix}.conv1", planes, channels, 1)
        bn(f"{prefix}.bn1", planes)
        conv(f"{prefix}.conv2", planes, planes, 3)
        bn(f"{prefix}.bn2", planes)
        conv(f"{prefix}.conv3", planes * 4, planes, 1)
        bn(f"{prefix}.bn3", planes * 4, last=True)
      if stride != 1 or channels != planes * expansion:
        conv(f"{prefix}.downsample.0", planes * expansion, channels, 1)
        bn(f"{prefix}.downsample.1", planes * expansion)
      channels = planes * expansion
  state["fc.weight"] = (rng.standard_normal((num_classes, channels)) * 0.1).astype(np.float32)
  state["fc.bias"] = rng.normal(0, 0.1, num_classes).astype(np.float32)
  return state


def _conv2d(x, w, stride):
  """x [N, C, H, W], w [O, C, k, k]; PyTorch padding k // 2."""
  k = w.shape[-1]
  pad = k // 2
  x = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
  n, c, h, wd = x.shape
  oh, ow = (h - k) // stride + 1, (wd - k) // stride + 1
  patches = np.empty((n, c, k, k, oh, ow), x.dtype)
  for i in range(k):
    for j in range(k):
      patches[:, :, i, j] = x[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
  return np.einsum("ncijhw,ocij->nohw", patches, w, optimize=True)


def _bn(x, state, name):
  scale = state[f"{name}.weight"] / np.sqrt(state[f"{name}.running_var"] + EPSILON)
  shift = state[f"{name}.bias"] - state[f"{name}.running_mean"] * scale
  return x * scale[None, :, None, None] + shift[None, :, None, None]


def _max_pool_3x3_s2(x):
  x = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
  n, c, h, w = x.shape
  oh, ow = (h - 3) // 2 + 1, (w - 3) // 2 + 1
  out = np.full((n, c, oh, ow), -np.inf, x.dtype)
  for i in range(3):
    for j in range(3):
      out = np.maximum(out, x[:, :, i:i + 2 * oh:2, j:j + 2 * ow:2])
  return out


def forward(state: Dict[str, np.ndarray], images_nhwc: np.ndarray, depth: int) -> np.ndarray:
  """torchvision ResNet logits [N, classes] for images [N, H, W, 3] (float64 math)."""
  s = {k: v.astype(np.float64) for k, v in state.items()}
  relu = lambda v: np.maximum(v, 0)
  x = images_nhwc.astype(np.float64).transpose(0, 3, 1, 2)
  x = _max_pool_3x3_s2(relu(_bn(_conv2d(x, s["conv1.weight"], 2), s, "bn1")))
  kind, blocks = BLOCKS[depth]
  for stage, num_blocks in enumerate(blocks):
    for b in range(num_blocks):
      p = f"layer{stage + 1}.{b}"
      stride = 2 if b == 0 and stage > 0 else 1
      shortcut = x
      if f"{p}.downsample.0.weight" in s:
        shortcut = _bn(_conv2d(x, s[f"{p}.downsample.0.weight"], stride), s, f"{p}.downsample.1")
      if kind == "basic":
        y = relu(_bn(_conv2d(x, s[f"{p}.conv1.weight"], stride), s, f"{p}.bn1"))
        y = _bn(_conv2d(y, s[f"{p}.conv2.weight"], 1), s, f"{p}.bn2")
      else:
        y = relu(_bn(_conv2d(x, s[f"{p}.conv1.weight"], 1), s, f"{p}.bn1"))
        y = relu(_bn(_conv2d(y, s[f"{p}.conv2.weight"], stride), s, f"{p}.bn2"))
        y = _bn(_conv2d(y, s[f"{p}.conv3.weight"], 1), s, f"{p}.bn3")
      x = relu(y + shortcut)
  pooled = x.mean(axis=(2, 3))
  return pooled @ s["fc.weight"].T + s["fc.bias"]


if __name__ == "__main__":
  from safetensors.numpy import save_file
  os.makedirs(FIXTURES, exist_ok=True)
  for file_name, (depth, width, classes) in TINY.items():
    save_file(state_dict(depth, width, classes, seed=depth), os.path.join(FIXTURES, file_name))
    print("wrote", os.path.join(FIXTURES, file_name))
