"""The Fashion-MNIST files: the four local idx `.gz` files, found, checked and read into numpy.

    images, labels = load_fashion_mnist("train[:55000]")   # uint8 [N, 28, 28, 1], int32 [N]

Splits are "train" (60,000), "test" (10,000) and slices of them,
"train[:55000]" / "train[55000:]" / "train[:90%]", so a validation split is
carved from train: the test split must never be used for model selection.

Both vision families read them: classification's `fashion_mnist` dataset
source and its converter (vision/classification/fashion_mnist.py, convert.py),
detection's pasted-objects generator (vision/detection/pasted_objects.py).
"""

import functools
import gzip
import os
import re
import zlib
from typing import Optional, Tuple

import numpy as np

from tpu_models.data.sources import DATA_ENV
from tpu_models.errors import DataError

DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_URL = "https://github.com/zalandoresearch/fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")
FASHION_MNIST_SIZES = {"train": 60000, "test": 10000}
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049  # idx: ubyte data, 3 or 1 dimensions.



def _fashion_mnist_candidates(path: str = ""):
  candidates = []
  if path:
    candidates.append(path)
  root = os.environ.get(DATA_ENV)
  if root:
    candidates += [os.path.join(root, "fashion-mnist"), root]
  candidates.append(DEBIAN_FASHION_MNIST)
  return candidates


def find_fashion_mnist(path: str = "") -> str:
  """The directory holding the four Fashion-MNIST idx `.gz` files.

  An explicit `path` must hold the files (no fallback: a typo must not
  silently train on another copy). Without one, searched in order:
  `$TPU_MODELS_DATA/fashion-mnist`, `$TPU_MODELS_DATA`,
  /usr/share/datasets/fashion-mnist (Debian).

  Raises:
    FileNotFoundError: naming the path, or every place searched, and how to get the files.
  """
  needed = [name for pair in _FILES.values() for name in pair]
  if path:  # An explicit path is used or refused, never silently replaced by another copy.
    missing = [n for n in needed if not os.path.isfile(os.path.join(path, n))]
    if not missing:
      return path
    what = ("does not exist" if not os.path.exists(path) else
            "is not a directory" if not os.path.isdir(path) else
            f"lacks {', '.join(missing)}")
    others = ", ".join(_fashion_mnist_candidates(""))
    raise FileNotFoundError(
        f"Fashion-MNIST data.path {path!r} {what}. Point it at the directory holding the four "
        f"idx .gz files ({', '.join(needed)}), or leave it empty to search {others} (not "
        f"searched: an explicit path is never replaced by another copy). Get the files with "
        f"`apt-get install dataset-fashion-mnist` (Debian) or from {FASHION_MNIST_URL}.")
  searched = []
  for directory in _fashion_mnist_candidates(path):
    if all(os.path.isfile(os.path.join(directory, n)) for n in needed):
      return directory
    searched.append(directory)
  where = "\n".join(f"  - {d}" for d in searched)
  raise FileNotFoundError(
      f"Fashion-MNIST files ({', '.join(needed)}) not found. Searched:\n{where}\n"
      f"Get them with `apt-get install dataset-fashion-mnist` (Debian; installs into "
      f"{DEBIAN_FASHION_MNIST}), or download the four files from {FASHION_MNIST_URL} "
      f"into ${DATA_ENV}/fashion-mnist (or the directory given as data.path).")


def _read_idx(filename: str, magic: int, item_shape: Tuple[int, ...],
              count: int) -> np.ndarray:
  """One idx file as uint8 [count, *item_shape], with its header checked.

  The header is read and checked first (magic, item shape, and the item count the split
  must have), then exactly the bytes it announces are decompressed, streamed, plus one
  to tell a longer file: a gzip bomb (2 MB that inflate to 2 GiB) costs the split's own
  size, never what the file would inflate to.
  """
  ndim = 1 + len(item_shape)
  header_size = 4 * (1 + ndim)
  try:
    with gzip.open(filename, "rb") as f:
      head = f.read(header_size)
      if len(head) < header_size:
        raise DataError(f"{filename} is too short ({len(head)} bytes) to be an idx file.")
      header = np.frombuffer(head, ">u4", count=1 + ndim)
      if int(header[0]) != magic:
        raise DataError(f"{filename} has idx magic number {int(header[0])}, expected {magic}; "
                        f"is it the right file?")
      announced, dims = int(header[1]), tuple(int(d) for d in header[2:])
      if dims != item_shape:
        raise DataError(f"{filename} holds items of shape {dims}, expected {item_shape}.")
      if announced != count:
        raise DataError(f"{filename}'s header announces {announced} items; this split has "
                        f"{count}. Re-download it from {FASHION_MNIST_URL}.")
      size = count * int(np.prod(item_shape, dtype=np.int64))
      data = _read_exactly(f, size + 1)  # One byte more tells a longer file.
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f"{filename} is not a readable gzip file (truncated or corrupt? "
                     f"re-download or reinstall it): {e}") from None
  if len(data) > size:
    raise DataError(f"{filename} inflates to more than the {header_size + size} bytes its "
                    f"header announces ({count} items); read no further (a gzip bomb, or not "
                    f"this split's file). Re-download it from {FASHION_MNIST_URL}.")
  if len(data) < size:
    raise DataError(f"{filename} holds {header_size + len(data)} bytes but its header "
                    f"announces {count} items ({header_size + size} bytes): the file is "
                    f"truncated or corrupt.")
  return np.frombuffer(data, np.uint8).reshape((count,) + item_shape)


def _read_exactly(f, limit: int) -> bytes:
  """Up to `limit` decompressed bytes of `f`, read in blocks (never more than `limit`)."""
  buffer = bytearray()
  while len(buffer) < limit:
    block = f.read(min(limit - len(buffer), 1 << 22))
    if not block:
      break
    buffer += block
  return bytes(buffer)


@functools.lru_cache(maxsize=4)
def _load_split(directory: str, split: str) -> Tuple[np.ndarray, np.ndarray]:
  images_file, labels_file = (os.path.join(directory, n) for n in _FILES[split])
  # Each file's header must announce the split's size (checked before its data is read).
  images = _read_idx(images_file, _IMAGES_MAGIC, (28, 28), FASHION_MNIST_SIZES[split])
  labels = _read_idx(labels_file, _LABELS_MAGIC, (), FASHION_MNIST_SIZES[split])
  if labels.max() > 9:
    raise DataError(f"{labels_file} holds label {labels.max()}; Fashion-MNIST labels are 0..9.")
  images = images[..., None]
  labels = labels.astype(np.int32)
  # Cached and shared between callers: make accidental in-place edits fail.
  images.flags.writeable = False
  labels.flags.writeable = False
  return images, labels


_SPLIT_RE = re.compile(r"^(train|test)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")


def _parse_split(split: str) -> Tuple[str, slice]:
  """'train[:55000]' -> ('train', slice(None, 55000)); percentages of the split allowed."""
  match = _SPLIT_RE.match(split.replace(" ", ""))
  if not match:
    raise DataError(
        f"Unknown Fashion-MNIST split {split!r}; use 'train', 'test', or a slice such as "
        f"'train[:55000]', 'train[55000:]' or 'train[:90%]' (carve validation from train).")
  name, start, stop = match.groups()
  size = FASHION_MNIST_SIZES[name]

  def bound(text: Optional[str]) -> Optional[int]:
    if text is None:
      return None
    if text.endswith("%"):
      return round(int(text[:-1]) * size / 100)
    return int(text)

  return name, slice(bound(start), bound(stop))


def load_fashion_mnist(split: str, path: str = "") -> Tuple[np.ndarray, np.ndarray]:
  """Fashion-MNIST as numpy arrays.

  Args:
    split: "train", "test", or a slice such as "train[:55000]" / "train[55000:]".
    path: a directory to search first (see `find_fashion_mnist`).

  Returns:
    (images uint8 [N, 28, 28, 1], labels int32 [N]); read-only arrays shared
    with later calls (copy before editing).
  """
  name, index = _parse_split(split)
  images, labels = _load_split(find_fashion_mnist(path), name)
  return images[index], labels[index]

