"""benchmarks/profile_train_step.py: op names to layers, and a real trace of the toy task's step."""

import os
import re

from conftest import benchmark_script, run_main

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_op_and_its_gradient_count_with_their_layer():
  layer_of = benchmark_script("profile_train_step").layer_of
  assert layer_of("efficientnet_b0_1/block2a_dwconv_1/depthwise", "efficientnet_b0") == "block2a_dwconv"
  assert layer_of("gradient_tape/efficientnet_b0_1/block2a_dwconv_1/depthwise/"
                  "DepthwiseConv2dNativeBackpropFilter", "efficientnet_b0") == "block2a_dwconv"
  assert layer_of("efficientnet_b0/stem_conv/Conv2D", "efficientnet_b0") == "stem_conv"
  # Outside the model: the scope, without the number TensorFlow appends.
  assert layer_of("sgd/ResourceApplyKerasMomentum_212", "efficientnet_b0") == "sgd"
  assert layer_of("gradient_tape/Mul_163", "efficientnet_b0") == "Mul"
  # Inside the Trainer's host loop (the step a function called from a tf.range loop).
  assert layer_of("while/body/_1/while/StatefulPartitionedCall/gradient_tape/toy_mlp_1/"
                  "logits_1/MatMul/MatMul_1", "toy_mlp") == "logits"
  assert layer_of("while/body/_1/while/StatefulPartitionedCall/sgd/ResourceApplyKerasMomentum_2",
                  "toy_mlp") == "sgd"
  assert layer_of("while/body/_1/while/add_11", "toy_mlp") == "add"
  # A layer whose name merely starts like the model's is a layer, not the model.
  assert layer_of("toy_mlp_head/MatMul", "toy_mlp") == "toy_mlp_head"


def _rows(stdout, title):
  """{first cell: ms per step} of the Markdown table headed `title`."""
  rows, inside = {}, False
  for line in stdout.splitlines():
    if line.startswith(f"| {title} |"):
      inside = True
    elif inside and line.startswith("| ") and not line.startswith("|---"):
      cells = [c.strip() for c in line.strip("|").split("|")]
      rows[cells[0]] = float(cells[1])
    elif inside and not line.startswith("|"):
      break
  return rows


def test_a_real_trace_of_the_trainers_step_is_summed_by_op_type_and_layer(capfd, monkeypatch):
  # The script's main() in this process, from tests/ (no child importing TensorFlow again).
  monkeypatch.chdir(TESTS)
  result = run_main(capfd, benchmark_script("profile_train_step").main,
                    ["toy.yaml", "--import", "toy_task", "--steps", "3", "--warmup", "2"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"3 traced steps, float32, cpu; wall \d+ ms per step", result.stdout)
  by_type, by_layer = _rows(result.stdout, "op type"), _rows(result.stdout, "layer")
  # The toy MLP's forward and backward are matmuls (TensorFlow's or oneDNN's), in its two layers.
  assert any("MatMul" in op for op in by_type), by_type
  assert {"hidden", "logits"} <= set(by_layer), by_layer
  total = by_type.pop("**all ops**")
  assert total > 0 and abs(sum(by_type.values()) - total) <= 0.01 * len(by_type) + 0.01
