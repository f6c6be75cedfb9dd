"""The detection record: a COCO-style tf.Example, written and parsed.

The schema (the one of the TF Object Detection API and Model Garden, so
their COCO shards read unchanged):

    image/encoded                 bytes    JPEG (or PNG)
    image/format                  bytes    "JPEG" / "PNG"
    image/source_id               bytes    the image id ("397133"); numeric for COCO
    image/filename                bytes    optional
    image/height, image/width     int64    pixel size
    image/object/bbox/xmin        float[]  normalised to 0..1 by the width
    image/object/bbox/ymin        float[]  ... by the height
    image/object/bbox/xmax        float[]
    image/object/bbox/ymax        float[]
    image/object/class/label      int64[]  0..K-1 (tpu_models converters; see label_map.json)
    image/object/class/text       bytes[]  optional, the class names
    image/object/is_crowd         int64[]  optional, 1 = a crowd region (ignored)
    image/object/mask             bytes[]  optional, one PNG per box: the instance over the
                                           whole image, 0 outside, 255 inside (masks.py)

`detection_example` writes one (the converters, tests); `parse_example` reads one
back in a tf.data map (the input pipeline, evaluation's source ids, anchor coverage).
"""

from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

ENCODED = "image/encoded"
FORMAT = "image/format"
SOURCE_ID = "image/source_id"
FILENAME = "image/filename"
HEIGHT = "image/height"
WIDTH = "image/width"
XMIN = "image/object/bbox/xmin"
YMIN = "image/object/bbox/ymin"
XMAX = "image/object/bbox/xmax"
YMAX = "image/object/bbox/ymax"
CLASS_LABEL = "image/object/class/label"
CLASS_TEXT = "image/object/class/text"
IS_CROWD = "image/object/is_crowd"
MASK = "image/object/mask"


# ----------------------------------------------------------------------------
# Writing records.


def _float_list(values) -> tf.train.Feature:
  return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def _int64_list(values) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _bytes_list(values) -> tf.train.Feature:
  values = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def detection_example(encoded: bytes,
                      *,
                      height: int,
                      width: int,
                      boxes: np.ndarray,
                      classes: Sequence[int],
                      source_id: str,
                      is_crowd: Optional[Sequence[int]] = None,
                      class_texts: Optional[Sequence[str]] = None,
                      filename: str = "",
                      image_format: str = "JPEG",
                      masks: Optional[Sequence[bytes]] = None) -> tf.train.Example:
  """One image and its boxes as a COCO-style record (see the module docstring).

  Args:
    encoded: the encoded image bytes.
    height, width: the image size in pixels.
    boxes: float [M, 4], [ymin, xmin, ymax, xmax] normalised to 0..1.
    classes: int [M], label ids 0..K-1.
    source_id: the image id, e.g. the COCO image id as a string.
    is_crowd: int [M] 0/1, default all 0.
    class_texts: [M] class names, optional.
    filename: where the image came from.
    image_format: "JPEG" or "PNG".
    masks: optional [M] PNG bytes, one instance mask per box over the whole
      image (`masks.encode_mask_png`); None writes none.

  Returns:
    A `tf.train.Example`.
  """
  boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
  num = len(boxes)
  if (len(classes) != num or (is_crowd is not None and len(is_crowd) != num)
      or (masks is not None and len(masks) != num)):
    raise ValueError(f"Image {source_id!r}: {num} boxes but {len(classes)} classes"
                     + (f", {len(is_crowd)} is_crowd flags" if is_crowd is not None else "")
                     + (f", {len(masks)} masks" if masks is not None else "")
                     + "; expected one of each per box.")
  feature = {
      ENCODED: _bytes_list([encoded]),
      FORMAT: _bytes_list([image_format]),
      SOURCE_ID: _bytes_list([str(source_id)]),
      FILENAME: _bytes_list([filename]),
      HEIGHT: _int64_list([height]),
      WIDTH: _int64_list([width]),
      YMIN: _float_list(boxes[:, 0]),
      XMIN: _float_list(boxes[:, 1]),
      YMAX: _float_list(boxes[:, 2]),
      XMAX: _float_list(boxes[:, 3]),
      CLASS_LABEL: _int64_list(classes),
      IS_CROWD: _int64_list(is_crowd if is_crowd is not None else [0] * num),
  }
  if class_texts is not None:
    feature[CLASS_TEXT] = _bytes_list(class_texts)
  if masks is not None:
    feature[MASK] = _bytes_list(masks)
  return tf.train.Example(features=tf.train.Features(feature=feature))


# ----------------------------------------------------------------------------
# Parsing.


def _source_id_to_int(source_id: tf.Tensor) -> tf.Tensor:
  """Numeric ids ("397133") as themselves, anything else hashed into 0..2^31-2."""
  numeric = tf.strings.regex_full_match(source_id, r"[0-9]{1,9}")
  return tf.cond(
      numeric,
      lambda: tf.strings.to_number(source_id, tf.int32),
      lambda: tf.cast(tf.strings.to_hash_bucket_fast(source_id, 2**31 - 1), tf.int32))


def parse_example(serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
  """Parses one serialized detection record; graph mode (tf.data map).

  Args:
    serialized: tf.string [], a `tf.train.Example` in the schema above.

  Returns:
    {"image/encoded": tf.string [],
     "source_id": int32 [] (the numeric image id; non-numeric ids are hashed),
     "height", "width": int32 [] as recorded (0 if absent),
     "boxes": float32 [M, 4] normalised [ymin, xmin, ymax, xmax],
     "classes": int32 [M], "is_crowd": bool [M],
     "mask_pngs": tf.string [M] (or [0] for a record without masks)}.
    A record whose per-object lists differ in length fails with an error
    naming the keys.
  """
  features = {
      ENCODED: tf.io.FixedLenFeature([], tf.string),
      SOURCE_ID: tf.io.FixedLenFeature([], tf.string, default_value=""),
      HEIGHT: tf.io.FixedLenFeature([], tf.int64, default_value=0),
      WIDTH: tf.io.FixedLenFeature([], tf.int64, default_value=0),
      YMIN: tf.io.VarLenFeature(tf.float32),
      XMIN: tf.io.VarLenFeature(tf.float32),
      YMAX: tf.io.VarLenFeature(tf.float32),
      XMAX: tf.io.VarLenFeature(tf.float32),
      CLASS_LABEL: tf.io.VarLenFeature(tf.int64),
      IS_CROWD: tf.io.VarLenFeature(tf.int64),
      MASK: tf.io.VarLenFeature(tf.string),
  }
  parsed = tf.io.parse_single_example(serialized, features)
  coords = [tf.sparse.to_dense(parsed[k]) for k in (YMIN, XMIN, YMAX, XMAX)]
  classes = tf.sparse.to_dense(parsed[CLASS_LABEL])
  is_crowd = tf.sparse.to_dense(parsed[IS_CROWD])
  mask_pngs = tf.sparse.to_dense(parsed[MASK])
  num = tf.shape(classes)[0]
  checks = [
      tf.debugging.assert_equal(
          tf.stack([tf.shape(c)[0] for c in coords]), tf.fill([4], num),
          message=f"{YMIN}/{XMIN}/{YMAX}/{XMAX} and {CLASS_LABEL} must have one value per "
                  f"object; the record's lists differ in length"),
      tf.debugging.assert_equal(
          tf.logical_or(tf.equal(tf.shape(is_crowd)[0], 0), tf.equal(tf.shape(is_crowd)[0], num)),
          True, message=f"{IS_CROWD} must be absent or have one value per object"),
      tf.debugging.assert_equal(
          tf.logical_or(tf.equal(tf.shape(mask_pngs)[0], 0), tf.equal(tf.shape(mask_pngs)[0], num)),
          True, message=f"{MASK} must be absent or have one PNG per object"),
  ]
  with tf.control_dependencies(checks):
    boxes = tf.stack(coords, axis=-1)
  is_crowd = tf.cond(tf.equal(tf.shape(is_crowd)[0], 0),
                     lambda: tf.zeros([num], tf.bool), lambda: tf.cast(is_crowd, tf.bool))
  return {
      ENCODED: parsed[ENCODED],
      "source_id": _source_id_to_int(parsed[SOURCE_ID]),
      "height": tf.cast(parsed[HEIGHT], tf.int32),
      "width": tf.cast(parsed[WIDTH], tf.int32),
      "boxes": tf.reshape(boxes, [-1, 4]),
      "classes": tf.cast(classes, tf.int32),
      "is_crowd": is_crowd,
      "mask_pngs": mask_pngs,
  }
