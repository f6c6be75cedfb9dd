"""The text family's CLI: `tpu-models vocab` and `tpu-models sample`.

    tpu-models vocab de_en_dictionary --output runs/vocab/de_en_8k --vocab-size 8000 \\
        --character-coverage 1.0
    tpu-models sample official/transformer/de_en_dictionary_lm.yaml --model-dir runs/de_en_lm \\
        --prompt "I would like" --top-k 40 --seed 1

Light at import time (the CLI builds its parser before TensorFlow loads): only
argparse here; the text modules are imported inside the run functions.
"""

import argparse


def add_commands(subparsers) -> None:
  """Adds `vocab` and `sample` to the CLI's subparsers."""
  from tpu_models import cli  # The generic CLI's helpers (argparse only).

  p = subparsers.add_parser("vocab", help="train a SentencePiece vocabulary (pad 0, EOS 1, UNK 2) "
                                          "on the training split of a text source")
  p.add_argument("source", help="a text dataset: de_en_dictionary, tsv, text_tfrecord, "
                                "wmt14_de_en; or an experiment YAML (its task.train_data)")
  p.add_argument("--output", required=True, metavar="PREFIX",
                 help="writes PREFIX.model and PREFIX.vocab, e.g. vocab/de_en_8k")
  p.add_argument("--vocab-size", type=int, default=8000)
  p.add_argument("--path", default="", help="without a YAML: the source's files or data "
                                            "directory (de_en_dictionary searches by default)")
  p.add_argument("--split", default="train", help="without a YAML: the split to learn from; "
                                                  "held-out splits (test, validation) are refused")
  p.add_argument("--fields", default="inputs,targets",
                 help="features to learn from, comma-separated (both sides: one shared vocabulary)")
  p.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram")
  p.add_argument("--character-coverage", type=float, default=0.9995,
                 help="share of the characters the vocabulary covers, the rarest others map to "
                      "UNK (SentencePiece's character_coverage; default 0.9995; 1.0 keeps every "
                      "character)")
  p.add_argument("--max-sentences", type=int, default=2_000_000,
                 help="learn from a reproducible random sample of at most this many sentences")
  p.add_argument("--overwrite", action="store_true",
                 help="replace an existing PREFIX.model (trained runs fingerprint their "
                      "vocabulary and refuse another one; by default this is refused)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="with a YAML: override a config value (repeatable)")
  p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                 help="with a YAML: import a module that registers your own datasets")
  p.set_defaults(run=_vocab)

  p = subparsers.add_parser("sample", help="continue a prompt with a trained language model (or "
                                           "translate it with a translation model)")
  cli.add_config_args(p, model_dir_required=True)
  p.add_argument("--prompt", action="append", required=True,
                 help="text to continue (repeatable: one output line each)")
  p.add_argument("--max-new-tokens", type=int, default=None,
                 help="tokens to generate (default: task.sample_max_new_tokens)")
  p.add_argument("--top-k", type=int, default=None,
                 help="sample among the k most likely tokens (default: greedy decoding)")
  p.add_argument("--temperature", type=float, default=None,
                 help="with --top-k: divides the logits (default: task.sample_temperature)")
  p.add_argument("--seed", type=int, default=None, help="with --top-k: reproducible sampling")
  p.set_defaults(run=_sample)


def _vocab(args: argparse.Namespace) -> int:
  from tpu_models import cli
  from tpu_models.config import DataConfig
  from tpu_models.errors import ConfigError
  from tpu_models.text import inputs as text
  if not 0 < args.character_coverage <= 1:
    raise ConfigError(f"--character-coverage {args.character_coverage}: expected a share in "
                      f"(0, 1], e.g. 0.9995 or 1.0.")
  import tensorflow as tf
  existing = [f"{args.output}{suffix}" for suffix in (".model", ".vocab")
              if tf.io.gfile.exists(f"{args.output}{suffix}")]
  if existing and not args.overwrite:
    raise ConfigError(f"{' and '.join(existing)} already exist(s): runs trained with it would "
                      f"no longer match it. Pass --overwrite to replace it, or choose another "
                      f"--output.")
  if args.source.endswith((".yaml", ".yml")):
    args.config, args.model_dir = args.source, None
    config, _ = cli.load_experiment(args)
    data_config = config.task.train_data
    if data_config is None:
      raise ConfigError(f"{args.source}: task {config.task.name!r} has no train_data to learn "
                        f"a vocabulary from.")
  else:
    data_config = DataConfig(source=args.source, path=args.path, split=args.split)
  fields = tuple(f.strip() for f in args.fields.split(",") if f.strip())
  path = text.train_vocab_from_source(data_config, args.output, args.vocab_size, keys=fields,
                                      model_type=args.model_type,
                                      character_coverage=args.character_coverage,
                                      max_sentences=args.max_sentences)
  print(f"Wrote {path} and {args.output}.vocab: {args.vocab_size} pieces (pad 0, EOS 1, UNK 2) "
        f"learned from {data_config.source} split {data_config.split!r}, fields "
        f"{', '.join(fields)}, character coverage {args.character_coverage:g}.")
  return 0


def _sample(args: argparse.Namespace) -> int:
  from tpu_models import cli, export
  from tpu_models import task as task_lib
  config, model_dir = cli.load_experiment(args)
  task_lib.require(config.task.name, task_lib.Sampler)  # Before loading weights.
  task, model = export.load_model(config, model_dir)
  task_lib.require(task, task_lib.Sampler)
  texts = task.sample(model, args.prompt, max_new_tokens=args.max_new_tokens, top_k=args.top_k,
                      temperature=args.temperature, seed=args.seed)
  for text in texts:
    print(text)
  return 0
