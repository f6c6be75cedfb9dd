#!/usr/bin/env bash
# Regenerates tests/data/model_garden/: TINY random-weight Model Garden checkpoints
# (saved as Model Garden's trainer saves them) and their outputs on fixed inputs,
# for tests/weights/test_model_garden_checkpoints.py (which needs no Model
# Garden venv). Needs benchmarks/.venv-model-garden (setup_venv.sh); ~1 minute.
#
#   bash benchmarks/model_garden/make_test_fixtures.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
python="${root}/benchmarks/.venv-model-garden/bin/python"
out="${root}/tests/data/model_garden"
worker="${here}/migration_worker.py"

rm -rf "${out:?}/resnet" "${out:?}/retinanet" "${out:?}/maskrcnn" "${out:?}/transformer"
# ResNet-18 (Model Garden projects the first shortcut of every stage), width 8, 32 px, 10 classes.
nice -n 10 "${python}" "${worker}" --family resnet --output "${out}/resnet" \
    --depth 18 --width 8 --image-size 32 --num-classes 10 --batch 2 --seed 1
# RetinaNet: ResNet-18/8 backbone, FPN 16 channels, 2 head convs, 128 px (a multiple
# of 2^max_level: the anchors agree only then), 5 classes in Model Garden's count
# (background 0 + 4 real).
nice -n 10 "${python}" "${worker}" --family retinanet --output "${out}/retinanet" \
    --depth 18 --width 8 --image-size 128 --num-classes 5 --fpn-channels 16 --head-convs 2 \
    --batch 2 --seed 2
# Mask R-CNN: ResNet-18/8 backbone, FPN 16 channels, maskrcnn_resnetfpn_coco's heads
# narrowed (detection head 2 convs + 1 FC of 32, mask head 2 convs of 16), 5 classes
# (background 0 + 4 real), 50 proposals, 10 detections, on two 128 px photos
# written by our Python (the venv has no scikit-image).
photos="$(mktemp --suffix=.npy)"
PYTHONPATH="${root}" nice -n 10 python3 "${here}/write_photos.py" "${photos}" --size 128 --count 2
nice -n 10 "${python}" "${worker}" --family maskrcnn --output "${out}/maskrcnn" \
    --depth 18 --width 8 --image-size 128 --num-classes 5 --fpn-channels 16 --head-convs 2 \
    --box-head-fcs 1 --fc-dims 32 --mask-head-convs 2 --mask-head-channels 16 --proposals 50 \
    --max-detections 10 --images "${photos}" --batch 2 --seed 5
rm -f "${photos}"
# Transformer: 2+2 layers, d 32, 4 heads, FFN 64, vocabulary 40; beam 4, 12 + 8 decode steps.
nice -n 10 "${python}" "${worker}" --family transformer --output "${out}/transformer" \
    --vocab-size 40 --hidden-size 32 --num-layers 2 --num-heads 4 --filter-size 64 \
    --source-length 12 --target-length 10 --beam-size 4 --alpha 0.6 --extra-decode-length 8 \
    --batch 2 --seed 3
du -sh "${out}"
