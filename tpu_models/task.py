"""The contract between a task and the common Trainer.

A task turns a `TaskConfig` into a model, its inputs, a loss and metrics. The
Trainer owns everything else (distribution, precision, the host loop,
checkpoints, logging), so a new task is only these few methods:

    @register_task("my_task")
    class MyTask(Task):
      config_class = MyTaskConfig
      def build_model(self): ...
      def build_inputs(self, split, input_context=None): ...
      def loss(self, labels, outputs): ...
      def metrics(self, labels, outputs, weights, aux=None): ...
      def metric_directions(self): ...   # {"accuracy": HIGHER, ...}

The loss is either per-example values [batch] (averaged over the GLOBAL batch)
or a `(sum, normaliser)` pair: the Trainer sums both over every replica before
dividing, so a per-token or per-matched-target mean is exact for any replica
count. A loss whose parts are metrics too returns `LossResult(loss, aux)`: the
Trainer hands `aux` to `metrics`, which reuses it instead of computing the
parts again. Metrics are (sum, count) pairs summed over replicas and steps and
reported as sum / count, exact for padded batches too. `metric_directions`
says for each evaluation metric whether higher or lower is better
(`trainer.target_metric` needs it).

Evaluation runs `eval_step` on every replica inside one compiled function; a
task that decodes (a search over outputs) or post-processes overrides it. Metrics
computed on the host (corpus-level scores, library evaluators) come from `eval_step`'s host outputs:
they are gathered from every replica of every host, padded examples are
dropped, and the rest is folded in by `aggregate` and turned into numbers by
`finalize`, both told the split ("eval", "test") they score.
"""

import abc
import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import keras
import tensorflow as tf

from tpu_models.config import DataConfig, ModelConfig, TaskConfig
from tpu_models.errors import ConfigError
from tpu_models.factory import create_model
from tpu_models.registry import TASKS

MetricSums = Dict[str, Tuple[tf.Tensor, tf.Tensor]]
Loss = Union[tf.Tensor, Tuple[tf.Tensor, tf.Tensor]]

# Metric directions (`Task.metric_directions`): which way is better.
HIGHER = "higher"
LOWER = "lower"
# Declared for a metric that is a count or a setting, not a quality (e.g. "examples").
NO_DIRECTION = None
MetricDirection = Optional[str]
LossAux = Mapping[str, tf.Tensor]


@dataclasses.dataclass(frozen=True)
class LossResult:
  """A task's loss with intermediates its `metrics` reuses (`Task.loss` may return one).

  Attributes:
    loss: per-example float32 [batch] or a (sum, normaliser) pair, as `Task.loss`.
    aux: tensors computed on the way (e.g. the loss's parts), handed unchanged to
      `Task.metrics(..., aux=aux)` of the same batch. Computed without the
      evaluation weights: in evaluation, padded examples must contribute nothing
      to them (all-zero labels), or the task overrides `eval_step`.
  """
  loss: Loss
  aux: LossAux


def split_loss(result: Union[Loss, LossResult]) -> Tuple[Loss, Optional[LossAux]]:
  """(the loss, its aux or None) of what `Task.loss` returned."""
  if isinstance(result, LossResult):
    return result.loss, result.aux
  return result, None


def task_metrics(task: "Task", labels, outputs, weights: tf.Tensor,
                 aux: Optional[LossAux]) -> MetricSums:
  """`task.metrics` of a batch, given the aux of its `LossResult` when the loss returned one."""
  if aux is None:
    return task.metrics(labels, outputs, weights)
  return task.metrics(labels, outputs, weights, aux=aux)


class Task:
  """Base class of every task; see the module docstring."""

  config_class = TaskConfig

  def __init__(self, config: TaskConfig):
    self.config = config

  def build_model(self) -> keras.Model:
    """A built Keras model. Called inside the strategy and precision scopes."""
    model_config: Optional[ModelConfig] = getattr(self.config, "model", None)
    if model_config is None:
      raise NotImplementedError(f"{type(self).__name__} must implement build_model().")
    return create_model(model_config.name, **model_config.params)

  def build_inputs(self, split: str,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """Per-replica batches: (features, labels) for 'train', plus a mask [batch] otherwise."""
    raise NotImplementedError

  def data_config(self, split: str) -> DataConfig:
    """The `DataConfig` of `split` ("train", "eval", "test"): the task config's `<split>_data`."""
    data = self.config.data(split)
    if not isinstance(data, DataConfig):
      raise ConfigError(f"task.{split}_data is not set (task {self.config.name!r}).")
    return data

  def synthetic_inputs(self, split: str,
                       input_context: Optional[tf.distribute.InputContext] = None
                       ) -> tf.data.Dataset:
    """Batches of the real shapes that cost no input work, for `benchmark` and `check`.

    The default repeats the first real batch forever (for evaluation: once, then
    as padding with mask 0); a task whose data may be absent (a large dataset on a
    laptop) overrides this with generated tensors.
    """
    first = self.build_inputs(split, input_context).take(1).cache()
    if split == "train":
      return first.repeat()
    padding = first.map(lambda *batch: (*batch[:-1], tf.zeros_like(batch[-1])))
    return first.concatenate(padding.repeat())

  def loss(self, labels, outputs) -> Union[Loss, LossResult]:
    """Per-example loss float32 [batch], or a (sum, normaliser) pair of float32 scalars.

    Per-example values are averaged over the global batch. A pair is summed over
    all replicas before the division (the normaliser clamped at >= 1), e.g.
    (sum of token losses, number of real tokens). In evaluation padded examples
    have all-zero labels: a pair must let them contribute nothing (zero tokens,
    zero positives), or the task overrides `eval_step`. Either may be wrapped in
    a `LossResult` whose `aux` the Trainer passes to `metrics`.
    """
    raise NotImplementedError

  def metrics(self, labels, outputs, weights: tf.Tensor,
              aux: Optional[LossAux] = None) -> MetricSums:
    """(sum, count) pairs for this batch; `weights` [batch] is 0 for padding.

    `aux` is the `LossResult.aux` of the same batch's loss (passed only when the
    loss returned a `LossResult`).
    """
    return {}

  def metric_directions(self) -> Dict[str, MetricDirection]:
    """{evaluation metric: HIGHER or LOWER (which way is better), or NO_DIRECTION}.

    The Trainer reads the direction of `trainer.target_metric` here (the target
    is reached at >= target_value for HIGHER, <= for LOWER); a target metric
    that is not declared, or declared NO_DIRECTION, is a ConfigError. A task
    adds its own metrics to these.
    """
    return {"loss": LOWER, "examples": NO_DIRECTION}

  def eval_step(self, model: keras.Model, features, labels,
                weights: tf.Tensor) -> Tuple[MetricSums, Any]:
    """One replica's evaluation of a batch, run inside the compiled eval function.

    Args:
      model: the model.
      features, labels: one per-replica batch.
      weights: float32 [batch], 1 for real examples and 0 for padding.

    Returns:
      (metric sums with at least "loss", host outputs or None). Host outputs are
      a nest of tensors whose first dimension is the batch; see `eval_outputs`.
    """
    outputs = model(features, training=False)
    loss, aux = split_loss(self.loss(labels, outputs))
    sums = {"loss": loss_sums(loss, weights)}
    sums.update(task_metrics(self, labels, outputs, weights, aux))
    return sums, self.eval_outputs(features, labels, outputs, weights)

  # Host-side metrics (computed off-device, e.g. by a third-party evaluator).

  def eval_outputs(self, features, labels, outputs, weights) -> Any:
    """Tensors [batch, ...] fetched to the host each eval step for `aggregate`; None = nothing.

    Numeric dtypes only (they are all-gathered across replicas and hosts).
    """
    return None

  def aggregate(self, state: Any, step_outputs: Any, *, split: str) -> Any:
    """Folds one eval step's host outputs into `state` (None at the start).

    `step_outputs` has the structure `eval_outputs` returned, as numpy arrays
    holding the real examples of this step from EVERY replica on every host
    (padding removed): [n_real, ...]. `split` is the split evaluated ("eval",
    "test"), e.g. to pick its ground truth.
    """
    return state

  def finalize(self, state: Any, *, split: str) -> Dict[str, float]:
    """Metrics from the aggregated `state` of `split` at the end of evaluation."""
    return {}

  def derived_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
    """Metrics computed from the averaged ones (e.g. exp(loss))."""
    return {}

  def required_files(self) -> Dict[str, str]:
    """Files the trained model cannot be used without, as {config key: path}.

    E.g. a tokenizer the model's ids mean nothing without. Their fingerprints
    (sha256) are recorded in the model_dir when training starts, and resuming,
    evaluating or exporting with a file of other contents is refused, naming
    both. The default: none.
    """
    return {}

  def write_eval_artifacts(self, state: Any, *, model_dir: str, step: int, split: str,
                           tensorboard: bool = True) -> List[str]:
    """Host-side files from one evaluation (e.g. pictures of predictions); the default: none.

    Called by the Trainer on the chief after `finalize`, when an evaluation is
    reported (`evaluate_and_report`: during training and `tpu-models evaluate`),
    with the `state` that `aggregate` built. Write under `model_dir` (and, with
    `tensorboard`, TensorBoard summaries under model_dir/summaries/<split>).

    Returns:
      The paths written.
    """
    return []

  def eval_metric_names(self) -> Optional[List[str]]:
    """The names `evaluate()` reports for this task's config, or None if not known up front.

    Lets the Trainer refuse a misspelt `trainer.target_metric` before training
    instead of at the first evaluation. The default (None) skips that check.
    """
    return None

  # Fine-tuning (`trainer.fine_tune`, `trainer.init_checkpoint`).

  def variable_groups(self) -> Dict[str, str]:
    """Named parts of this task's model: {group name: regex searched in variable paths}.

    `trainer.fine_tune.freeze` and `lr_multipliers` accept these names besides
    regexes, so a config can say which part to freeze without knowing the
    model's layer names. The default names none.
    """
    return {}

  def label_dependent_variables(self) -> Optional[str]:
    """A regex over variable paths: the layers whose shape follows the label set.

    A warm start from a checkpoint of another label set (another number of
    classes) gives these layers the model's own initial values (the builder's
    initialisers) and reports the stored ones as dropped; any other shape
    difference is an error unless `trainer.fine_tune.reinitialize` lists it.
    None (the default): no such layers.
    """
    return None


# ----------------------------------------------------------------------------
# Optional capabilities: small named interfaces a task class also derives from.
# The CLI checks `isinstance(task, Capability)`; a task without one gets a
# one-line error naming the registered tasks that have it (`require`).


class Capability(abc.ABC):
  """Base of the optional task interfaces; `command` is the CLI command that needs it."""
  command: str = ""


class Servable(Capability):
  """`tpu-models export`: the task knows the SavedModel's serving signatures."""
  command = "export"

  @abc.abstractmethod
  def serving_signatures(self, model: keras.Model) -> Dict[str, Any]:
    """Name -> concrete `tf.function` for SavedModel export (preprocessing included)."""

  def serving_outputs(self) -> Dict[str, Dict[str, str]]:
    """{signature name: {output name: its dtype, shape and meaning in words}}, recorded in
    the SavedModel's assets.extra/export.json as "outputs"; default: none recorded."""
    return {}


@dataclasses.dataclass
class DeployFunction:
  """One function of a deployment export (`Deployable.deploy_functions`): what a converter
  turns into a graph of its own (a LiteRT signature, an ONNX model).

  Attributes:
    function: a concrete `tf.function` of named float32 or integer inputs whose first
      dimension is the batch, returning a dict of named tensors; everything it needs is
      inside (preprocessing and postprocessing the format can hold).
    inputs: {input name: what it holds, dtype and shape in words}, for `export.json`.
    outputs: {output name: the same}.
    outside_graph: what the caller does before or after the call because the formats
      cannot hold it, e.g. "decoding encoded files: pass decoded uint8 values".
    integer_inputs: names of float32 inputs that hold whole numbers 0..255: the export
      takes them as uint8 (a cast in float graphs, the quantized input of int8 ones).
    no_int8: why this function cannot be quantized to int8 ("" = it can); non-empty,
      `--format litert-int8` is refused with this reason before converting.
    float_scopes: {tf.name_scope of the function: why its ops stay float32 in an int8
      export}; the rest is quantized, with (de)quantize ops at the boundary. The
      scope's ops are those whose tensor names hold `<scope>/` (loops' bodies too).
  """
  function: Any
  inputs: Mapping[str, str]
  outputs: Mapping[str, str]
  outside_graph: Sequence[str] = ()
  integer_inputs: Sequence[str] = ()
  no_int8: str = ""
  float_scopes: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Agreement:
  """How often an export gives the SavedModel path's answer (`Deployable.deployed_agreement`).

  Attributes:
    agreeing: examples whose answer is the reference's (the task's `unit` says what was
      compared).
    total: examples compared.
    unit: what was compared, in words, e.g. "outputs of eval examples".
  """
  agreeing: int
  total: int
  unit: str

  @property
  def fraction(self) -> float:
    return self.agreeing / self.total if self.total else 0.0

  def __str__(self) -> str:
    return f"{100 * self.fraction:.1f}% ({self.agreeing} of {self.total} {self.unit})"


class Deployable(Capability):
  """`tpu-models export --format litert|litert-int8|onnx` and `tpu-models evaluate-export`.

  The task hands over the functions to convert, the calibration examples of an int8
  export, its own metric of an export's runtime and how often an export agrees with
  the SavedModel path; the core converts, checks, writes and runs.

  `int8_agreement_floor`: the least `Agreement.fraction` an int8 export of the task
  must reach against the SavedModel path (float formats: deploy.FLOAT_AGREEMENT_FLOOR).
  """
  command = "export --format"
  int8_agreement_floor: float = 0.95

  @abc.abstractmethod
  def deploy_functions(self, model: keras.Model) -> Dict[str, DeployFunction]:
    """Signature name -> the function an export holds under that name."""

  @abc.abstractmethod
  def calibration_inputs(self, examples: int) -> Any:
    """Up to `examples` inputs of the quantized functions, from the task's training pipeline.

    Returns:
      An iterable of {signature name: {input name: float32 numpy [1, ...]}} (one
      example each, the values the function's inputs take: e.g. pixels before
      normalisation). A DataError when the training data is missing.
    """

  def prepare_to_load_export(self) -> None:
    """Makes this process able to load the task's exports, before one is opened (e.g.
    registers TensorFlow ops its SavedModel's graph uses). Default: nothing to do."""

  @abc.abstractmethod
  def evaluate_deployed(self, run: Callable[[str, Mapping[str, Any]], Mapping[str, Any]],
                        split: str, *, say: Optional[Callable[[str], None]] = None
                        ) -> Dict[str, float]:
    """The task's own metrics of `split`, computed through `run`.

    Args:
      run: (signature name, {input name: numpy array}) -> {output name: numpy array},
        one call of the export's runtime (integer inputs given as uint8).
      split: "eval" or "test": the split whose data config is read.
      say: receives progress lines.
    """

  @abc.abstractmethod
  def deployed_agreement(self, reference: Callable[[str, Mapping[str, Any]], Mapping[str, Any]],
                         exported: Callable[[str, Mapping[str, Any]], Mapping[str, Any]],
                         examples: int, split: str = "eval") -> Agreement:
    """How often `exported` answers as `reference` on up to `examples` of `split`.

    Both are `run` callables as in `evaluate_deployed`, given the same inputs of the
    export's signatures (e.g. the split's images as uint8 pixels at the export's input
    shape). `reference` runs the SavedModel path in TensorFlow: the SavedModel's
    signature of that name, or the unconverted deploy function where the SavedModel has
    none.
    """


class FilePredictor(Capability):
  """`tpu-models predict`: the task runs a model on input files and writes its results."""
  command = "predict"

  @abc.abstractmethod
  def predict_files(self, model: keras.Model, paths: Sequence[str], output_dir: str, *,
                    options: Optional[Mapping[str, Any]] = None,
                    say: Optional[Callable[[str], None]] = None) -> List[str]:
    """Runs `model` on the files `paths`, writes results to `output_dir`.

    Args:
      model: the trained model (float32).
      paths: input files (any tf.io.gfile path).
      output_dir: where the results go (created).
      options: the `predict` options the task's family added to the CLI (`add_options`
        in tpu_models/cli.py: dest -> value); missing keys mean the task's defaults.
      say: receives one line per input; an input that cannot be read is reported
        through it and skipped, the others are still processed.

    Returns:
      The paths that failed (empty when all succeeded).
    """


class Sampler(Capability):
  """`tpu-models sample`: the task turns text prompts into generated text."""
  command = "sample"

  @abc.abstractmethod
  def sample(self, model: keras.Model, prompts: Sequence[str], **options) -> List[str]:
    """One output string per prompt; `options` are the sample command's (e.g. top_k, seed)."""


class DataReporter(Capability):
  """`tpu-models check`: the task has findings about its training data."""
  command = "check"

  @abc.abstractmethod
  def data_report(self) -> List[Tuple[str, str]]:
    """(severity "warning"|"error", message) findings about the training data."""


def create_task(config: TaskConfig) -> Task:
  """Instantiates the registered task named `config.name`."""
  return TASKS.get(config.name)(config)


def tasks_with(capability: type) -> List[str]:
  """Names of the registered tasks whose class derives from `capability` (e.g. `Servable`)."""
  return [name for name in TASKS.names() if issubclass(TASKS.get(name), capability)]


def unsupported_message(task_name: str, capability: type) -> str:
  """The error text for a task that lacks `capability`: which tasks have it."""
  having = tasks_with(capability)
  return (f"task {task_name!r} does not support `tpu-models {capability.command}`; tasks that "
          f"do: {', '.join(having) if having else '(none registered)'}.")


def require(task: Union[str, Task], capability: type) -> None:
  """Raises ConfigError (`unsupported_message`) unless `task` has `capability`.

  Args:
    task: a task, or the registered name of one (checked without building it).
    capability: e.g. `Servable`.
  """
  if isinstance(task, str):
    name, has_it = task, issubclass(TASKS.get(task), capability)
  else:
    name, has_it = task.config.name, isinstance(task, capability)
  if not has_it:
    raise ConfigError(unsupported_message(name, capability))


def weighted_mean(values: tf.Tensor, weights: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """(sum(values * weights), sum(weights)) in float32, for `Task.metrics`."""
  weights = tf.cast(weights, tf.float32)
  return tf.reduce_sum(tf.cast(values, tf.float32) * weights), tf.reduce_sum(weights)


def loss_sums(loss: Loss, weights: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, tf.Tensor]:
  """A task's loss as a float32 (sum, normaliser) pair.

  Per-example values [batch] become (sum(loss * weights), sum(weights)) (weights
  default to 1); a (sum, normaliser) pair is returned as float32.
  """
  if isinstance(loss, (tuple, list)):
    if len(loss) != 2:
      raise TypeError(f"Task.loss returned {len(loss)} values; expected per-example values "
                      f"or a (sum, normaliser) pair.")
    return tf.cast(loss[0], tf.float32), tf.cast(loss[1], tf.float32)
  per_example = tf.cast(loss, tf.float32)
  if per_example.shape.rank != 1:
    raise TypeError(f"Task.loss returned shape {per_example.shape}; expected per-example "
                    f"values [batch] or a (sum, normaliser) pair of scalars.")
  if weights is None:
    weights = tf.ones_like(per_example)
  return weighted_mean(per_example, weights)


def is_pair(loss: Loss) -> bool:
  """Whether a task's loss is a (sum, normaliser) pair rather than per-example values."""
  return isinstance(loss, (tuple, list))
