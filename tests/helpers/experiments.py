"""The experiment dict of a tiny training run in a test, written once."""


def tiny_experiment(task: dict, *, train_steps: int, steps_per_loop: int, schedule: dict,
                    **trainer) -> dict:
  """An experiment dict (for config.experiment_from_dict): `task`, trained with AdamW on
  `schedule` for `train_steps` steps in loops of `steps_per_loop`, one checkpoint at the end,
  no TensorBoard (`trainer`: more trainer fields, e.g. eval_every), on the CPU."""
  return {
      "task": task,
      "trainer": {"train_steps": train_steps, "steps_per_loop": steps_per_loop,
                  "checkpoint_every": train_steps, "optimizer": {"name": "adamw"},
                  "schedule": schedule, "tensorboard": False, **trainer},
      "runtime": {"strategy": "cpu"}}
