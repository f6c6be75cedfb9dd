"""Sweeps: train variants of one experiment on Ray Tune, rank them, ship the best.

    tpu-models sweep SWEEP.yaml [--address auto] [--report] [--export-best --format litert]

spec.py     the sweep file (an experiment YAML with a `sweep:` section), checked up front
trial.py    one trial: an ordinary Trainer run in its own model_dir, reporting to Tune
driver.py   starts or resumes Tune (a local Ray, or a cluster), the progress line (needs Ray)
files.py    what a sweep directory holds, read and written without Ray
results.py  leaderboard, CSV, curves PNG, the machinery's overhead, the best trial
best.py     export the best trial and score it once on the test split

See docs/sweeps.md.
"""

# The driver's Ray Tune settings, read from the environment by Tune in the driver process:
# set by the CLI before TensorFlow is imported (tpu_models/startup.py says why not later).
DRIVER_ENVIRON = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",  # metrics.jsonl is ours.
    "RAY_AIR_NEW_OUTPUT": "0",  # verbose=0 then prints nothing of Tune's.
    # Tune's experiment state is small: save it often, so that a killed driver re-runs as
    # little as possible.
    "TUNE_GLOBAL_CHECKPOINT_S": "5",
}
