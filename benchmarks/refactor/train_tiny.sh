#!/usr/bin/env bash
# Usage: bash benchmarks/refactor/train_tiny.sh CHECKOUT OUT_DIR
# 200 fixed-seed float32 steps of every family (the official recipes made tiny), one CLI
# process each, the loss of every step in OUT_DIR/<family>/metrics.jsonl. Run it in two
# checkouts (before and after a refactor), then: python benchmarks/refactor/same_losses.py A B
# TF_DETERMINISTIC_OPS=1 (deterministic kernels and tf.data order) and runtime.seed make
# two runs of one checkout bit-identical on CPU.
set -euo pipefail
REPO=$1; OUT=$2; mkdir -p "$OUT"
export PYTHONPATH=$REPO TF_DETERMINISTIC_OPS=1 TF_CPP_MIN_LOG_LEVEL=2
cd "$REPO"
D=${SAME_LOSSES_DATA:-/tmp/same_losses_data}
[ -f $D/vocab/de_en_1k.model ] || python -m tpu_models.cli vocab de_en_dictionary --output $D/vocab/de_en_1k --vocab-size 1000 --max-sentences 50000
[ -d $D/pasted ] || python -m tpu_models.cli convert pasted-objects $D/pasted --num-train 128 --num-validation 16 --num-test 0 --num-shards 1
COMMON="--mode train --set trainer.train_steps=200 --set trainer.steps_per_loop=1 --set trainer.checkpoint_every=1000 --set trainer.tensorboard=false --set runtime.mixed_precision=float32 --set runtime.strategy=cpu --set runtime.seed=7"
run() { name=$1; shift; rm -rf "$OUT/$name"; python -m tpu_models.cli train "$@" --model-dir "$OUT/$name" $COMMON > "$OUT/$name.log" 2>&1 || { echo "$name failed"; tail -5 "$OUT/$name.log"; }; }
run classification official/resnet/fashion_mnist_resnet.yaml --set task.train_data.global_batch_size=32 --set task.model.width=8
run detection official/retinanet/pasted_objects_retinanet.yaml --set "task.train_data.path=$D/pasted/train-*" --set task.train_data.global_batch_size=4 --set task.model.backbone_width=8 --set task.model.fpn_channels=16 --set task.model.head_convs=1 --set task.model.image_size=64 --set task.model.max_level=5
run translation official/transformer/de_en_dictionary.yaml --set task.vocab_path=$D/vocab/de_en_1k.model --set task.model.vocab_size=1000 --set task.train_data.global_batch_size=8
run language_modeling official/transformer/de_en_dictionary_lm.yaml --set task.vocab_path=$D/vocab/de_en_1k.model --set task.model.vocab_size=1000 --set task.train_data.global_batch_size=8 --set task.unigram_baseline=false
run maskrcnn official/maskrcnn/pasted_objects_maskrcnn.yaml --set "task.train_data.path=$D/pasted/train-*" --set task.train_data.global_batch_size=2 --set task.model.backbone_width=8 --set task.model.fpn_channels=16 --set task.model.image_size=64 --set task.model.box_head_dims=32 --set task.model.mask_head_channels=8 --set task.model.mask_head_convs=1 --set task.model.train_proposals=64 --set task.model.num_sampled_rois=32 --set task.model.num_mask_rois=8
