"""Boxes and labels drawn onto images with numpy (no PIL: it is not a dependency).

    picture = draw.draw_detections(pixels, boxes, classes, scores, class_names,
                                   min_score=0.3, ground_truth=(gt_boxes, gt_classes))
    draw.write_png("out/cat.png", picture)

Instance masks (a segmenter's) go under the boxes: `draw_masks(pixels, masks, classes,
scores)` fills each mask semi-transparently in its class colour and outlines it; then
`draw_detections` on that picture.

Boxes are [ymin, xmin, ymax, xmax] in pixels of the image they are drawn on
(the detection task's convention). Labels use a built-in 5x7 bitmap font:
letters are drawn upper-case, characters it lacks as "?". Predictions get one
colour per class; ground truth is drawn in white, thinner, labelled by name only.
"""

import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

# Rows of each 5x7 glyph, top to bottom; bit 4 is the leftmost column.
_GLYPHS: Dict[str, Tuple[int, ...]] = {
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E),
    "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F),
    "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02),
    "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E),
    "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E),
    "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    "A": (0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11),
    "B": (0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E),
    "C": (0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E),
    "D": (0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C),
    "E": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F),
    "F": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10),
    "G": (0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F),
    "H": (0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "I": (0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "J": (0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C),
    "K": (0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11),
    "L": (0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F),
    "M": (0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11),
    "N": (0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11),
    "O": (0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "P": (0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10),
    "Q": (0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D),
    "R": (0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11),
    "S": (0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E),
    "T": (0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04),
    "U": (0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "V": (0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "W": (0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A),
    "X": (0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11),
    "Y": (0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04),
    "Z": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F),
    " ": (0,) * 7,
    ".": (0, 0, 0, 0, 0, 0x0C, 0x0C),
    ",": (0, 0, 0, 0, 0x0C, 0x04, 0x08),
    ":": (0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0),
    "-": (0, 0, 0, 0x1F, 0, 0, 0),
    "_": (0, 0, 0, 0, 0, 0, 0x1F),
    "/": (0, 0x01, 0x02, 0x04, 0x08, 0x10, 0),
    "(": (0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02),
    ")": (0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08),
    "%": (0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03),
    "?": (0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04),
    "=": (0, 0, 0x1F, 0, 0x1F, 0, 0),
    "+": (0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0),
    "#": (0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A),
    "'": (0x0C, 0x04, 0x08, 0, 0, 0, 0),
    "&": (0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D),
}
GLYPH_WIDTH, GLYPH_HEIGHT = 5, 7

# Distinct, saturated colours for classes (class c gets _PALETTE[c % len]).
_PALETTE = np.array([
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
    (145, 30, 180), (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212),
    (0, 128, 128), (220, 190, 255), (170, 110, 40), (255, 250, 200), (128, 0, 0),
    (170, 255, 195), (128, 128, 0), (255, 215, 180), (0, 0, 128), (128, 128, 128)], np.uint8)
GROUND_TRUTH_COLOR = (255, 255, 255)


def class_color(class_id: int) -> Tuple[int, int, int]:
  """The RGB colour of predictions of `class_id`."""
  return tuple(int(v) for v in _PALETTE[int(class_id) % len(_PALETTE)])


def _glyph_mask(char: str) -> np.ndarray:
  rows = _GLYPHS.get(char.upper(), _GLYPHS["?"])
  bits = np.array([[(row >> (GLYPH_WIDTH - 1 - col)) & 1 for col in range(GLYPH_WIDTH)]
                   for row in rows], bool)
  return bits


def text_mask(text: str, scale: int = 1) -> np.ndarray:
  """bool [7 * scale, (6 * len(text) - 1) * scale]: `text` in the 5x7 font, one column apart."""
  if not text:
    return np.zeros([GLYPH_HEIGHT * scale, 0], bool)
  gap = np.zeros([GLYPH_HEIGHT, 1], bool)
  columns = []
  for i, char in enumerate(text):
    if i:
      columns.append(gap)
    columns.append(_glyph_mask(char))
  mask = np.concatenate(columns, axis=1)
  return np.kron(mask, np.ones([scale, scale], bool)).astype(bool)


def _as_rgb_uint8(image: np.ndarray) -> np.ndarray:
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
    raise ValueError(f"Expected an image [H, W, 1|3|4], got shape {image.shape}.")
  if image.dtype != np.uint8:
    image = np.clip(np.round(image.astype(np.float32)), 0, 255).astype(np.uint8)
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  return np.ascontiguousarray(image[..., :3])


def _paint(canvas: np.ndarray, top: int, left: int, mask: np.ndarray, color) -> None:
  """Sets canvas pixels under `mask` (placed at top, left; clipped to the canvas) to `color`."""
  height, width = canvas.shape[:2]
  bottom, right = top + mask.shape[0], left + mask.shape[1]
  t, l, b, r = max(top, 0), max(left, 0), min(bottom, height), min(right, width)
  if t >= b or l >= r:
    return
  region = canvas[t:b, l:r]
  region[mask[t - top:b - top, l - left:r - left]] = color


def default_scale(image_shape) -> int:
  """Font scale and line thickness for an image: 1 up to ~400 px on the short side, then more."""
  return max(1, int(round(min(image_shape[:2]) / 400)))


def draw_box(canvas: np.ndarray, box: Sequence[float], color, thickness: int = 1,
             label: str = "", scale: int = 1) -> None:
  """Draws one box (and a label on a filled tag above it) onto `canvas` in place.

  Args:
    canvas: uint8 [H, W, 3], modified in place.
    box: [ymin, xmin, ymax, xmax] in canvas pixels (clipped to the canvas).
    color: RGB of the outline and the tag.
    thickness: outline width in pixels, drawn inside the box.
    label: text on the tag ("" = none). Black or white, whichever reads on `color`.
    scale: font scale (1 = 5x7 pixels per character).
  """
  height, width = canvas.shape[:2]
  ymin, xmin, ymax, xmax = (float(v) for v in box)
  top = int(np.clip(np.floor(ymin), 0, height - 1))
  left = int(np.clip(np.floor(xmin), 0, width - 1))
  bottom = int(np.clip(np.ceil(ymax) - 1, top, height - 1))
  right = int(np.clip(np.ceil(xmax) - 1, left, width - 1))
  t = max(1, int(thickness))
  canvas[top:min(top + t, bottom + 1), left:right + 1] = color
  canvas[max(bottom - t + 1, top):bottom + 1, left:right + 1] = color
  canvas[top:bottom + 1, left:min(left + t, right + 1)] = color
  canvas[top:bottom + 1, max(right - t + 1, left):right + 1] = color
  if not label:
    return
  glyphs = text_mask(label, scale)
  pad = scale
  tag_h, tag_w = glyphs.shape[0] + 2 * pad, glyphs.shape[1] + 2 * pad
  # Above the box when there is room, else inside its top edge.
  tag_top = top - tag_h if top - tag_h >= 0 else top
  tag_left = min(left, max(0, width - tag_w))
  _paint(canvas, tag_top, tag_left, np.ones([tag_h, tag_w], bool), color)
  luminance = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2]
  _paint(canvas, tag_top + pad, tag_left + pad, glyphs,
         (0, 0, 0) if luminance > 128 else (255, 255, 255))


def label_text(class_id: int, class_names: Optional[Sequence[str]],
               score: Optional[float] = None) -> str:
  """"name 0.87" (or "name" without a score); the id when there are no names for it."""
  names = class_names or []
  name = names[class_id] if 0 <= class_id < len(names) else str(class_id)
  return name if score is None else f"{name} {score:.2f}"


def draw_detections(image: np.ndarray,
                    boxes: np.ndarray,
                    classes: np.ndarray,
                    scores: np.ndarray,
                    class_names: Optional[Sequence[str]] = None,
                    *,
                    min_score: float = 0.0,
                    ground_truth: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                    scale: Optional[int] = None) -> np.ndarray:
  """A copy of `image` with the detections (and optionally the ground truth) drawn on it.

  Args:
    image: uint8 (or float 0..255) [H, W, 1|3|4]; drawn on as RGB.
    boxes: float [D, 4] [ymin, xmin, ymax, xmax] in pixels of `image`.
    classes: int [D] labels 0..K-1 (negative = padding, skipped).
    scores: float [D]; detections below `min_score` are skipped.
    class_names: name per label (None: labels drawn as ids).
    min_score: the lowest score drawn.
    ground_truth: optional (boxes [G, 4], classes [G]) drawn first, in white.
    scale: font scale and outline thickness (default: from the image size).

  Returns:
    uint8 [H, W, 3].
  """
  canvas = _as_rgb_uint8(image).copy()
  scale = scale or default_scale(canvas.shape)
  if ground_truth is not None:
    for box, class_id in zip(np.asarray(ground_truth[0]).reshape(-1, 4),
                             np.asarray(ground_truth[1]).reshape(-1)):
      if class_id >= 0:
        draw_box(canvas, box, GROUND_TRUTH_COLOR, thickness=scale,
                 label=label_text(int(class_id), class_names), scale=scale)
  order = np.argsort(np.asarray(scores).reshape(-1), kind="stable")  # Best drawn last (on top).
  boxes = np.asarray(boxes).reshape(-1, 4)
  classes = np.asarray(classes).reshape(-1)
  scores = np.asarray(scores).reshape(-1)
  for i in order:
    if classes[i] < 0 or scores[i] < min_score:
      continue
    draw_box(canvas, boxes[i], class_color(int(classes[i])), thickness=2 * scale,
             label=label_text(int(classes[i]), class_names, float(scores[i])), scale=scale)
  return canvas


def _edges(mask: np.ndarray, thickness: int) -> np.ndarray:
  """bool [H, W]: the pixels of `mask` within `thickness` pixels of its outside (4-neighbours)."""
  inner = mask.copy()
  for _ in range(max(1, int(thickness))):
    shrunk = inner.copy()
    shrunk[1:] &= inner[:-1]
    shrunk[:-1] &= inner[1:]
    shrunk[:, 1:] &= inner[:, :-1]
    shrunk[:, :-1] &= inner[:, 1:]
    shrunk[0], shrunk[-1], shrunk[:, 0], shrunk[:, -1] = False, False, False, False
    inner = shrunk
  return mask & ~inner


def draw_masks(image: np.ndarray,
               masks: np.ndarray,
               classes: np.ndarray,
               scores: np.ndarray,
               *,
               min_score: float = 0.0,
               alpha: float = 0.45,
               scale: Optional[int] = None) -> np.ndarray:
  """A copy of `image` with instance masks filled semi-transparently and outlined.

  Each instance in its class colour (the colour `draw_detections` gives its box): the
  fill blends that colour over the photo at `alpha`, the outline (`scale` pixels, inside
  the mask) is opaque, so touching instances of one class stay apart. Best score drawn
  last (on top). Draw the boxes and labels over the result with `draw_detections`.

  Args:
    image: uint8 (or float 0..255) [H, W, 1|3|4]; drawn on as RGB.
    masks: [D, H, W] binary (nonzero = inside), at the image's size; or a sequence of D
      such [H, W] masks other than a list or tuple, read one at a time (`masks[i]`, only
      for the instances drawn: each may be computed when read, e.g. pasted on the host).
    classes: int [D] labels 0..K-1 (negative = padding, skipped).
    scores: float [D]; instances below `min_score` are skipped.
    min_score: the lowest score drawn.
    alpha: the fill's opacity, 0..1.
    scale: outline thickness (default: from the image size, as `draw_detections`).

  Returns:
    uint8 [H, W, 3].
  """
  canvas = _as_rgb_uint8(image).copy()
  if isinstance(masks, (np.ndarray, list, tuple)):
    masks = np.asarray(masks).reshape(-1, *canvas.shape[:2]) if np.size(masks) else np.zeros(
        [0, *canvas.shape[:2]], bool)
  classes = np.asarray(classes).reshape(-1)
  scores = np.asarray(scores).reshape(-1)
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be between 0 and 1, got {alpha}.")
  if len(masks) != len(classes) or len(scores) != len(classes):
    raise ValueError(f"Expected one mask, class and score per instance; got {len(masks)} "
                     f"masks, {len(classes)} classes, {len(scores)} scores.")
  scale = scale or default_scale(canvas.shape)
  for i in np.argsort(scores, kind="stable"):
    if classes[i] < 0 or scores[i] < min_score:
      continue
    inside = np.asarray(masks[i]) > 0
    rows, columns = np.flatnonzero(inside.any(axis=1)), np.flatnonzero(inside.any(axis=0))
    if not len(rows):
      continue
    # The mask's bounding window and one pixel around it (outside the mask, as the image's
    # border is for `_edges`): the same drawing, at a fraction of a large photo's cost.
    window = (slice(max(rows[0] - 1, 0), rows[-1] + 2),
              slice(max(columns[0] - 1, 0), columns[-1] + 2))
    inside, region = inside[window], canvas[window]  # A view: drawn into the canvas.
    color = np.array(class_color(int(classes[i])), np.float32)
    blended = (1.0 - alpha) * region[inside].astype(np.float32) + alpha * color
    region[inside] = np.clip(np.round(blended), 0, 255).astype(np.uint8)
    region[_edges(inside, scale)] = color.astype(np.uint8)
  return canvas


def detection_lines(boxes: np.ndarray, classes: np.ndarray, scores: np.ndarray,
                    class_names: Optional[Sequence[str]] = None,
                    min_score: float = 0.0) -> List[str]:
  """"name 0.87 [ymin, xmin, ymax, xmax]" per detection at or above `min_score`, best first."""
  lines = []
  for i in np.argsort(-np.asarray(scores).reshape(-1), kind="stable"):
    if classes[i] < 0 or scores[i] < min_score:
      continue
    box = ", ".join(f"{v:.0f}" for v in boxes[i])
    lines.append(f"{label_text(int(classes[i]), class_names, float(scores[i]))} [{box}]")
  return lines


def write_png(path: str, image: np.ndarray) -> str:
  """Writes uint8 [H, W, 3] as a PNG to `path` (any tf.io.gfile path); returns `path`."""
  import tensorflow as tf  # The drawing above needs numpy only.

  tf.io.gfile.makedirs(os.path.dirname(path) or ".")
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(tf.io.encode_png(_as_rgb_uint8(image)).numpy())
  return path
