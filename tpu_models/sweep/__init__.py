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
