"""Bilinear sampling written out with loops: the definition the loop-written references of
RoIAlign (test_roi_ops) and of mask pasting (test_maskrcnn_serving) share."""

import numpy as np


def bilinear(grid: np.ndarray, y: float, x: float):
  """`grid` ([H, W] or [H, W, C]) at the continuous point (y, x), cell centres at integers:
  the four nearest cells weighted by distance, a point in (-1, 0) or (size - 1, size) taking
  the edge cell's value (RoIAlign's and torchvision's paste's rule); 0 outside
  (-1, H) x (-1, W). Returns a float, or a [C] array for a [H, W, C] grid."""
  height, width = grid.shape[:2]
  if not (-1 < y < height and -1 < x < width):
    return 0.0
  y, x = min(max(y, 0.0), height - 1.0), min(max(x, 0.0), width - 1.0)
  y0, x0 = int(np.floor(y)), int(np.floor(x))
  y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
  fy, fx = y - y0, x - x0
  return ((1 - fy) * (1 - fx) * grid[y0, x0] + (1 - fy) * fx * grid[y0, x1] +
          fy * (1 - fx) * grid[y1, x0] + fy * fx * grid[y1, x1])
