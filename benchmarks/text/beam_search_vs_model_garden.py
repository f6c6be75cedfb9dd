"""Peer check: our `sequence_beam_search` vs TF Model Garden's, same step function.

Both searches run on the same deterministic `symbols_to_logits_fn`
(benchmarks/model_garden/beam_search_worker.py: random logits indexed by the
step and the last id, plus terms read from a cache that must follow the
beams) for several (batch, beam, alpha, length, vocabulary) settings, some
with a strong EOS so beams finish early and the search stops before the
maximum length. Model Garden runs in its own venv (Keras 2 / tf_keras), in
both its `padded_decode` modes; ours runs eagerly and compiled with XLA. The
script prints, per setting, the steps Model Garden's search ran before it
stopped, how many returned beams finished with EOS, whether the ids are
identical and the largest absolute score difference, and exits non-zero on
any mismatch.

    python benchmarks/text/beam_search_vs_model_garden.py

Needs the Model Garden venv: bash benchmarks/model_garden/setup_venv.sh
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

WORKER = os.path.join(harness.BENCHMARKS, "model_garden", "beam_search_worker.py")
EOS_ID = 1

# (batch, beam, alpha, max decode length, vocabulary, EOS logit boost).
SETTINGS = [
    (2, 4, 0.6, 10, 50, 0.0),
    (3, 1, 0.6, 8, 20, 0.0),
    (4, 3, 0.0, 12, 30, 1.5),
    (2, 8, 1.0, 16, 64, 2.5),
    (1, 2, 0.6, 20, 100, 1.0),
    (8, 4, 0.6, 24, 200, 2.0),
    (3, 2, 0.0, 20, 40, 6.0),   # EOS dominant: the search stops early.
    (2, 4, 0.6, 30, 30, 8.0),
]


def make_cases(seed: int):
  """Settings and their random tables (float32), keyed for the .npz file."""
  rng = np.random.default_rng(seed)
  settings, arrays = [], {}
  for index, (batch, beam, alpha, length, vocab, eos_boost) in enumerate(SETTINGS):
    name = f"case{index}"
    table = rng.normal(size=(length, vocab, vocab)).astype(np.float32) * 2.0
    table[:, :, EOS_ID] += eos_boost  # A larger boost finishes beams sooner.
    arrays[f"{name}/table"] = table
    arrays[f"{name}/history"] = rng.normal(size=(vocab + 1, vocab)).astype(np.float32)
    arrays[f"{name}/rows"] = rng.normal(size=(batch, vocab)).astype(np.float32)
    settings.append(dict(name=name, batch=batch, beam=beam, alpha=alpha, length=length,
                         vocab=vocab, eos_id=EOS_ID, eos_boost=eos_boost))
  arrays["settings"] = np.array(json.dumps(settings))
  return settings, arrays


def run_ours(case_file: str):
  """Our search on every case, eagerly and under XLA: {key: array}."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  sys.path.insert(0, harness.REPO)
  sys.path.insert(0, os.path.dirname(WORKER))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from beam_search_worker import cases_from_file, table_symbols_to_logits_fn  # pylint: disable=g-import-not-at-top
  from tpu_models.text.beam_search import sequence_beam_search  # pylint: disable=g-import-not-at-top

  results = {}
  for name, s, table, history, rows in cases_from_file(case_file):
    fn, initial_cache = table_symbols_to_logits_fn(table, history, rows)

    def search(fn=fn, initial_cache=initial_cache, s=s):
      return sequence_beam_search(fn, tf.zeros([s["batch"]], tf.int32),
                                  initial_cache(s["batch"]), s["vocab"], s["beam"], s["alpha"],
                                  s["length"], s["eos_id"])

    for mode, run in (("eager", search), ("xla", tf.function(search, jit_compile=True))):
      ids, scores = run()
      results[f"{name}/{mode}/ids"] = ids.numpy()
      results[f"{name}/{mode}/scores"] = scores.numpy()
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seed", type=int, default=0, help="Seed of the random tables.")
  parser.add_argument("--mg-python", default=harness.MG_PYTHON,
                      help="Python of the Model Garden venv.")
  parser.add_argument("--timeout", type=float, default=900.0)
  args = parser.parse_args(argv)
  harness.require_model_garden(args.mg_python)

  settings, arrays = make_cases(args.seed)
  with tempfile.TemporaryDirectory(prefix="beam_search_peer_") as directory:
    case_file = os.path.join(directory, "cases.npz")
    mg_file = os.path.join(directory, "model_garden.npz")
    np.savez(case_file, **arrays)
    peer_info = harness.run_worker(
        [args.mg_python, WORKER, "--cases", case_file, "--output", mg_file], args.timeout)
    if peer_info is None:
      sys.exit("The Model Garden worker failed (see above).")
    theirs = dict(np.load(mg_file))
    ours = run_ours(case_file)

  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (already loaded by run_ours)
  print(f"Model Garden {peer_info['model_garden']} (TF {peer_info['tensorflow']}, its venv) vs "
        f"tpu_models (TF {tf.__version__}); seed {args.seed}.")
  print("| batch | beam | alpha | length | vocab | EOS boost | steps run | finished beams | "
        "ids equal (ours eager / XLA vs MG padded / unpadded) | max abs score diff |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
  all_equal = True
  for s in settings:
    name = s["name"]
    reference_ids = theirs[f"{name}/padded/ids"]
    equal, score_diff = [], 0.0
    for mine in ("eager", "xla"):
      for peer in ("padded", "unpadded"):
        same = np.array_equal(ours[f"{name}/{mine}/ids"], theirs[f"{name}/{peer}/ids"])
        equal.append(same)
        score_diff = max(score_diff, float(np.max(np.abs(
            ours[f"{name}/{mine}/scores"] - theirs[f"{name}/{peer}/scores"]))))
    finished = int(np.sum(np.any(reference_ids[:, :, 1:] == EOS_ID, axis=-1)))
    ok = all(equal) and score_diff < 1e-4
    all_equal &= ok
    print(f"| {s['batch']} | {s['beam']} | {s['alpha']} | {s['length']} | {s['vocab']} | "
          f"{s['eos_boost']} | {int(theirs[f'{name}/unpadded/steps'])} | "
          f"{finished}/{s['batch'] * s['beam']} | "
          f"{'yes' if all(equal) else 'NO ' + str(equal)} | {score_diff:.2e} |")
  print("All ids equal and scores within 1e-4." if all_equal else "MISMATCH (see above).")
  return 0 if all_equal else 1


if __name__ == "__main__":
  sys.exit(main())
