"""Image preprocessing shared by both vision families, graph-mode, with static output shapes.

    transforms.py  decode + crop (fused JPEG decode-and-crop), resize, pad-and-crop,
                   flip, normalize, and back to pixels for display
    augment.py     RandAugment (per image) and mixup (per batch)
    limits.py      the size read from an image's header before decoding, the
                   `max_image_pixels` limit, serving's checked decode

Everything is importable from here (`from tpu_models.vision import image`):

    image = image.decode_and_random_crop(record["image/encoded"], 224)
"""

from tpu_models.vision.image.augment import (RANDAUGMENT_MAX_MAGNITUDE, RANDAUGMENT_OPS,
                                             check_randaugment, mixup, randaugment,
                                             randaugment_op)
from tpu_models.vision.image.limits import (DEFAULT_MAX_IMAGE_PIXELS, FORMATS, assert_not_empty,
                                            check_image_header, check_max_image_pixels,
                                            decode_checked, export_image_shape,
                                            read_image_header)
from tpu_models.vision.image.transforms import (DEFAULT_CROP_FRACTION, IMAGENET_MEAN_RGB,
                                                IMAGENET_STD_RGB, center_crop, center_crop_batch,
                                                decode_and_center_crop, decode_and_random_crop,
                                                denormalize_to_pixels, normalize,
                                                pad_and_random_crop, pixel_rows, random_flip,
                                                random_resized_crop, resize_batch)

__all__ = [
    "DEFAULT_CROP_FRACTION", "DEFAULT_MAX_IMAGE_PIXELS", "FORMATS", "IMAGENET_MEAN_RGB",
    "IMAGENET_STD_RGB", "RANDAUGMENT_MAX_MAGNITUDE", "RANDAUGMENT_OPS", "assert_not_empty",
    "center_crop", "center_crop_batch", "check_image_header", "check_max_image_pixels",
    "check_randaugment", "decode_and_center_crop", "decode_and_random_crop", "decode_checked",
    "denormalize_to_pixels", "export_image_shape", "mixup", "normalize", "pad_and_random_crop",
    "pixel_rows", "randaugment", "randaugment_op", "random_flip", "random_resized_crop",
    "read_image_header", "resize_batch",
]
