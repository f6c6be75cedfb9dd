"""The command line shared by the comparison workers (ours_worker.py, model_garden/mg_worker.py).

Standard library only: it is imported both by our Python and inside the Model
Garden virtualenv, so the two sides always take the same flags.
"""

import argparse


def parse_worker_args(description, modes, argv=None):
  """Parses --mode/--batch/--precision/--steps/--warmup/--data/--seconds."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--mode", choices=sorted(modes), required=True)
  parser.add_argument("--batch", type=int, default=32, help="Global batch size.")
  parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                      help="float32, or bfloat16 = the mixed_bfloat16 policy (input_pipeline: "
                           "the dtype of the output images).")
  parser.add_argument("--steps", type=int, default=8, help="Timed train steps.")
  parser.add_argument("--warmup", type=int, default=3,
                      help="Untimed train steps first (tracing, allocator warm-up).")
  parser.add_argument("--data", default="", help="input_pipeline: TFRecord glob.")
  parser.add_argument("--seconds", type=float, default=20.0, help="input_pipeline: measured time.")
  args = parser.parse_args(argv)
  if args.mode == "input_pipeline" and not args.data:
    parser.error("--mode input_pipeline needs --data (a TFRecord glob).")
  return args


def timed_steps(run, batch, steps):
  """Calls `run(steps)` once and times it.

  Returns ({"images_per_second", "step_seconds", "page_faults_per_step"}, run's result).
  Minor page faults count memory freshly mapped during the steps (POSIX only).
  """
  import resource
  import time
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  start = time.perf_counter()
  value = run(steps)
  seconds = time.perf_counter() - start
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  return {"images_per_second": batch * steps / seconds, "step_seconds": seconds / steps,
          "page_faults_per_step": faults / steps}, value
