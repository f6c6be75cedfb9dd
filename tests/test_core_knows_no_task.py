"""The core (everything in tpu_models/ outside vision/ and text/) names no task.

No family, task kind, family model or family metric may appear in the core's
source, comments and docstrings included: a core that mentions them has grown a
special case, or documents one family's behaviour where another's reader looks
for the generic one. Generic examples (`"loss"`, `my_model`,
`official/<model>/<experiment>.yaml`) say the same without a task. TensorFlow's
own op names (`NonMaxSuppressionV3`) are not task words: they name what a TPU
cannot compile.

A word matches case-insensitively between non-letters, so identifiers count
too: `resnet50`, `fashion_mnist`, `top1_accuracy`, `RetinaNet`.
"""

import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tpu_models"
FAMILY_PACKAGES = ("vision", "text")

# Regex alternatives: families and their models, task kinds, family ops, family
# metrics and family datasets.
FORBIDDEN = (
    # Task kinds and families.
    r"classif[a-z]*", r"detections?", r"detectors?", r"translat[a-z]*",
    r"language[ _]model(?:s|ing|ling)?",
    # Models.
    r"resnets?", r"retinanets?", r"transformers?", r"bert",
    # Family ops and inputs.
    r"anchors?", r"nms", r"beams?", r"vocab(?:ulary|ularies|s)?", r"sentencepiece", r"mixup",
    r"focal",
    # Family metrics.
    r"bleu", r"top[15]", r"perplexity", r"coco",
    # Family datasets.
    r"imagenet", r"mnist", r"wmt",
)
WORD = re.compile(r"(?<![A-Za-z])(?:" + "|".join(FORBIDDEN) + r")(?![A-Za-z])", re.IGNORECASE)

def core_files():
  """Every .py file of the core, as paths relative to tpu_models/, sorted."""
  files = []
  for path in sorted(PACKAGE.rglob("*.py")):
    relative = path.relative_to(PACKAGE).as_posix()
    if relative.split("/")[0] not in FAMILY_PACKAGES:
      files.append(relative)
  return files


def task_words(path: pathlib.Path):
  """["file:line:word", ...] for each forbidden word in the file."""
  found = []
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    for match in WORD.finditer(line):
      found.append(f"tpu_models/{path.relative_to(PACKAGE).as_posix()}:{number}:{match.group(0)}")
  return found


def test_the_walk_covers_the_whole_core():
  files = core_files()
  for expected in ("__init__.py", "cli.py", "config/schema.py", "config/convert.py", "registry.py",
                   "task.py",
                   "export/deployment.py",
                   "distribute.py", "errors.py", "data/pipeline.py", "training/trainer.py",
                   "training/tpu_check.py"):
    assert expected in files
  assert not [f for f in files if f.startswith(("vision/", "text/"))]


def test_the_matcher_finds_identifiers_and_spares_ordinary_words():
  for text in ("ResNet-50", "resnet50", "fashion_mnist", "eval/top1_accuracy", "RetinaNet",
               "num_detections", "beam search", "Vocabulary", "translate names", "a classifier",
               "language_modeling", "NMS"):
    assert WORD.search(text), text
  for text in ("transform", "transformation", "columns", "Albert", "anchored", "NonMaxSuppressionV3",
               "loss", "my_model", "official/<model>/<experiment>.yaml"):
    assert not WORD.search(text), text


@pytest.mark.parametrize("relative", core_files())
def test_core_file_names_no_task(relative):
  found = task_words(PACKAGE / relative)
  assert not found, "The core names a task (reword generically):\n" + "\n".join(found)
