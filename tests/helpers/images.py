"""Image files for the fault tests: a decompression bomb, a COCO annotation file."""

import json
import struct
import zlib

# 400 megapixels: 1.2 GB as uint8 RGB, several GB on the way through a model.
BOMB_SIDE = 20000


def bomb_png(side: int = BOMB_SIDE) -> bytes:
  """A grayscale PNG of side x side zeros: a few hundred KB that decode to side**2 bytes."""
  def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
  packer, row, parts = zlib.compressobj(9), b"\0" * (side + 1), []
  for _ in range(side):
    parts.append(packer.compress(row))
  parts.append(packer.flush())
  return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
          + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b""))


def coco_file(path, file_names, ids):
  """The pathlib `path`, written as a COCO file of one box per image (16x16 images named
  `file_names`, ids `ids`); images[k] gets the box (k, k, 8, 8)."""
  data = {"images": [{"id": i, "file_name": f, "height": 16, "width": 16}
                     for i, f in zip(ids, file_names)],
          "annotations": [{"id": k + 1, "image_id": i, "bbox": [k, k, 8, 8], "category_id": 1,
                           "iscrowd": 0} for k, i in enumerate(ids)],
          "categories": [{"id": 1, "name": "thing"}]}
  path.write_text(json.dumps(data))
  return path
