"""Stop signals: SIGTERM and SIGINT save a checkpoint and stop, and several workers vote to stop together.

A signal reaches only the workers it was sent to; `_stop_requests` all-reduces
the workers' requests so every worker saves the same step and stops (one
checkpoint, no worker left waiting in a collective).
"""

import contextlib
import os
import signal
import sys
import threading
from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tpu_models.training.progress import Reporter, write_unless_unread


class Preempted(RuntimeError):
  """SIGTERM or SIGINT (Ctrl-C) arrived; a checkpoint at `step` was saved before stopping.

  `exit_code` is the shell's convention for the signal: 143 (SIGTERM), 130 (SIGINT).
  On several workers, `by` names the other worker(s) whose signal stopped this one
  (None when this worker received it); every worker exits with the signal's code.
  """

  def __init__(self, step: int, path: str, signal_name: str = "SIGTERM",
               by: Optional[str] = None):
    how = "Interrupted (Ctrl-C)" if signal_name == "SIGINT" else f"Stopped by {signal_name}"
    if by:
      super().__init__(f"Stopped at step {step} because {by} received {signal_name}; "
                       f"checkpoint saved to {path}. Run the same command again on every worker "
                       f"to resume.")
    else:
      super().__init__(f"{how} at step {step}; checkpoint saved to {path}. "
                       f"Run the same command again to resume.")
    self.step = step
    self.path = path
    self.signal_name = signal_name
    self.by = by
    self.exit_code = 128 + int(getattr(signal, signal_name, signal.SIGTERM))


_STOP_SIGNALS = ("SIGTERM", "SIGINT")  # What `_catch_stop_signals` stops for.


class StopSignals:
  """The Trainer's stop signals and multi-worker stop vote (a part of `Trainer`)."""

  def _stop_if_signalled(self, reporter: Reporter) -> None:
    """After SIGTERM/SIGINT: save at the current step (unless just saved) and raise Preempted.

    On several workers the signal of any one of them stops all: every worker
    calls this at the same points of the loop, and `_stop_requests` tells each
    which workers were signalled, so all save the same step together and stop.
    """
    requests = self._stop_requests()
    if not requests:
      return
    step = self.current_step
    saved_step, path = self._last_saved
    if saved_step != step:  # The same on every worker: they save together.
      path = self.save_checkpoint()
    own = dict(requests).get(self._workers[self._worker_index])
    signal_name = own or requests[0][1]
    peers = None if own else " and ".join(name for name, _ in requests)
    if len(self._workers) > 1:
      who = ", ".join(f"{name} received {kind}" for name, kind in requests)
      reporter.message(f"{who}: checkpoint saved at step {step} by all {len(self._workers)} "
                       f"workers.")
    else:
      reporter.message(f"{signal_name}: checkpoint saved at step {step}.")
    raise Preempted(step, path, signal_name, by=peers)

  def _stop_requests(self) -> List[Tuple[str, str]]:
    """[(worker name, "SIGTERM" or "SIGINT")] of the workers asked to stop; [] to go on.

    One process: this one's signal. Several workers: a signal reaches only the
    workers it was sent to, and a worker that stopped alone would leave the
    others waiting in the next collective step, so each worker's signal is put
    to a vote: an all-reduce of every worker's flags (a few floats, once per loop
    of steps), which every worker calls at the same point and reads alike. Unlike
    `tf.distribute.experimental.PreemptionCheckpointHandler` this needs no extra
    loop after the signal, no call counter kept in the checkpoint, and no request
    to a cloud metadata server (docs/reliability.md, "Stop signals on several workers").
    """
    signalled, kind = self._sigterm.is_set(), self._stop_signal
    if len(self._workers) == 1:
      return [(self._workers[0], kind)] if signalled else []
    if self._stop_vote_fn is None:
      self._stop_vote_fn = self._build_stop_vote()
    flags = np.zeros([len(self._workers), len(_STOP_SIGNALS)], np.float32)
    if signalled:
      flags[self._worker_index, _STOP_SIGNALS.index(kind)] = 1.0
    votes = self._stop_vote_fn(tf.constant(flags)).numpy()
    return [(self._workers[w], _STOP_SIGNALS[k]) for w, k in zip(*np.nonzero(votes > 0))]

  def _build_stop_vote(self):
    """flags float32 [workers, signals] (this worker's row set) -> their sum over all replicas."""

    def all_reduce(flags):
      flags = tf.identity(flags)  # On this replica's device (an all-reduce needs one).
      return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, flags)

    @tf.function
    def vote(flags):
      return self.strategy.experimental_local_results(self.strategy.run(all_reduce, (flags,)))[0]

    return vote

  @contextlib.contextmanager
  def _catch_stop_signals(self):
    """While training: SIGTERM or SIGINT asks for a checkpoint at the current step, then a stop.

    Python runs signal handlers only between bytecodes, i.e. after the compiled
    loop of steps returns; a watcher thread woken through `signal.set_wakeup_fd`
    reacts at once instead: it says what will happen, and on a SECOND Ctrl-C
    ends the process immediately (exit 130) without saving.
    """
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    names = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}
    previous = {signum: signal.getsignal(signum) for signum in names}
    interrupts = []

    def on_signal(signum):
      if signum not in names:
        return
      if signum == signal.SIGINT:
        interrupts.append(signum)
      if len(interrupts) >= 2:
        latest = tf.train.latest_checkpoint(self.model_dir)
        self._notice(f"Second interrupt: stopping now without saving (the last checkpoint is "
                     f"{latest or 'none'}).")
        os._exit(130)  # pylint: disable=protected-access  At once: the main thread may be in C++.
      if not self._sigterm.is_set():
        self._stop_signal = names[signum]
        self._sigterm.set()
        extra = " (press Ctrl-C again to stop at once without saving)" if interrupts else ""
        self._notice(f"{names[signum]}: saving a checkpoint after the current loop of steps, "
                     f"then stopping{extra}.")

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def watch():
      while True:
        try:
          data = os.read(read_fd, 64)
        except OSError:
          return
        if not data or 0 in data:  # Closed, or our stop byte.
          return
        for signum in data:
          on_signal(signum)

    try:
      previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # Not usable here: handle signals in the main thread only.
      previous_fd, watcher = None, None
    else:
      watcher = threading.Thread(target=watch, name="stop-signals", daemon=True)
      watcher.start()
    for signum in names:
      # With the watcher, the Python-level handler only keeps SIGINT from raising
      # KeyboardInterrupt; without it, it does the work (after the loop returns).
      signal.signal(signum, (lambda s, f: None) if watcher else (lambda s, f: on_signal(s)))
    try:
      yield
    finally:
      for signum, handler in previous.items():
        signal.signal(signum, handler)
      if watcher is not None:
        signal.set_wakeup_fd(previous_fd)
        os.write(write_fd, b"\0")
        watcher.join(timeout=5)
      os.close(write_fd)
      os.close(read_fd)

  def _notice(self, text: str) -> None:
    """A line on stderr from any thread (signal notices)."""
    if self.chief:
      write_unless_unread(sys.stdout, "")  # Flushes what precedes the notice.
      write_unless_unread(sys.stderr, text + "\n")
