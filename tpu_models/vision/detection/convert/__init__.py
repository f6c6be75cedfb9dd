"""Converters to sharded detection TFRecords (the record of example.py).

    convert_coco("annotations/instances_train2017.json", "train2017/", "/data/coco/train")
    convert_voc("VOC2012/Annotations", "/data/voc/train",
                image_set_file="VOC2012/ImageSets/Main/train.txt")
    convert_csv("annotations.csv", "/data/mine/train", class_names="classes.csv")

The CSV is the one-box-per-line format of keras-retinanet and its relatives:
`path,x1,y1,x2,y2,class_name` in pixels, one line per box, an image without
boxes as `path,,,,,`; paths relative to the CSV's directory (or `image_dir`).

Class ids in the records are 0..K-1. `label_map.json` beside the shards lists
`{"label", "name", "category_id"}` per class (COCO category ids are sparse;
the COCO evaluator maps labels back to them). Converting a second split into
the same directory reuses that label map, so train and validation agree.

Every image is decoded once to check it: unreadable or missing images are
reported and skipped; non-JPEG images are re-encoded as JPEG. Each box is
checked: non-finite coordinates ("nan"), no area ("zero_area"), no area left
inside the image ("outside_image"), a class missing from the label map
("unknown_class"), or an unreadable line or annotation ("malformed") skip the
box, counted per reason (the first few of each are printed); boxes that only
stick out of the image are clipped ("clipped", kept).

With masks (`convert_coco(include_masks=True)`, `--masks`), every box also
gets its instance mask from the COCO `segmentation` (polygons or RLE), written
as one PNG per box (`masks.py`); a box whose mask is missing, malformed, a
polygon of fewer than 3 points, of another size than the image, outside it,
empty, or far from the box (IoU of the box and the mask's extent below
`masks.MIN_MASK_BOX_IOU`) is skipped and counted under that reason
(`masks.MASK_INVALID_REASONS`), like a bad box. Crowd boxes (COCO
`iscrowd`, VOC `difficult` by default) are written with `is_crowd` = 1: the
input pipeline ignores them in matching and COCO evaluation ignores them too.

Images are sorted, shuffled with `shuffle_seed` and dealt round-robin to the
shards, so the same input and seed always give the same shards.

Which module owns what:

    writing.py    label maps, image paths, box checks and the shared shard writer
    coco_json.py  COCO instances JSON (with masks)
    voc_xml.py    Pascal VOC XML folders
    csv_lines.py  one-box-per-line CSV
"""

from tpu_models.vision.detection.convert.coco_json import convert_coco
from tpu_models.vision.detection.convert.csv_lines import convert_csv
from tpu_models.vision.detection.convert.voc_xml import convert_voc
from tpu_models.vision.detection.convert.writing import (INVALID_REASONS, LABEL_MAP_FILE,
                                                         image_path, label_map_path,
                                                         read_label_map)

__all__ = ["INVALID_REASONS", "LABEL_MAP_FILE", "convert_coco", "convert_csv", "convert_voc",
           "image_path", "label_map_path", "read_label_map"]
