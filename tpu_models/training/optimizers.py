"""Optimizers from `OptimizerConfig`, and the weight-decay exclusion rule.

SGD (momentum, Nesterov), LARS, AdamW, Adafactor and RMSProp (with momentum:
ms = rho * ms + (1 - rho) * g^2; m = momentum * m + lr * g / sqrt(ms + epsilon);
w -= m, Keras' RMSprop; its mean square starts at 0). Vectors (biases, batch-norm
gamma/beta) and variables whose path contains an `exclude_from_weight_decay`
substring are excluded from weight decay, the coupled L2 penalty and LARS'
layer-wise trust ratio, as in the published large-batch recipes.

Layer-wise learning rates (`trainer.fine_tune.lr_multipliers`): every optimizer
can scale the learning rate of chosen variables by a factor, in its update
(the fused SGD kernel included) and in its decoupled weight decay.
"""

import types
from typing import Dict, List, Optional, Sequence

import keras
import tensorflow as tf

from tpu_models.config import OptimizerConfig
from tpu_models.errors import ConfigError


def decays(variable, exclude: Sequence[str] = ()) -> bool:
  """Whether weight decay / L2 applies to `variable` (matrices and kernels only)."""
  if len(variable.shape) <= 1:
    return False
  path = getattr(variable, "path", variable.name)
  return not any(pattern in path for pattern in exclude)


def l2_penalty(variables, l2: float, exclude: Sequence[str] = ()) -> tf.Tensor:
  """l2 * sum(w**2) / 2 over the decayed variables, in float32."""
  if not l2:
    return tf.constant(0.0)
  terms = [tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in variables
           if decays(v, exclude)]
  return 0.5 * l2 * tf.add_n(terms) if terms else tf.constant(0.0)


class SGD(keras.optimizers.SGD):
  """Keras' SGD (momentum, Nesterov) with the momentum update fused into one kernel.

  Keras 3 updates each variable with ~5 elementwise ops (read, scale, subtract,
  assign, assign-add), each a full pass over the weights; `ResourceApplyKerasMomentum`
  does the same arithmetic in one pass (and has an XLA kernel for TPUs):
    m = momentum * m - lr * g;  w = w + m     (Nesterov: w = w + momentum * m - lr * g)
  Same variables and checkpoints as `keras.optimizers.SGD`.
  """

  def update_step(self, gradient, variable, learning_rate):
    if self.momentum == 0 or isinstance(gradient, tf.IndexedSlices):
      return super().update_step(gradient, variable, learning_rate)
    momentum = self.momentums[self._get_variable_index(variable)]
    var = variable.value if isinstance(variable, keras.Variable) else variable
    tf.raw_ops.ResourceApplyKerasMomentum(
        var=var.handle, accum=momentum.value.handle,
        lr=tf.cast(learning_rate, var.dtype), grad=tf.cast(gradient, var.dtype),
        momentum=tf.cast(self.momentum, var.dtype), use_nesterov=self.nesterov)


class LARS(keras.optimizers.Optimizer):
  """Layer-wise Adaptive Rate Scaling (You et al. 2017) with momentum.

  For each decayed variable w with gradient g (the formulation of the
  LARSOptimizer in the tensorflow/tpu reference models):
    trust = eta * |w| / (|g| + wd * |w|)     (1 where either norm is 0)
    v = momentum * v + lr * trust * (g + wd * w)
    w = w - v                  (Nesterov: w - (momentum * v + lr * trust * (g + wd * w)))
  Excluded variables (biases, BN) use trust 1 and no decay.
  """

  def __init__(self, learning_rate=0.1, momentum: float = 0.9, weight_decay: float = 0.0,
               eta: float = 0.001, nesterov: bool = False,
               exclude_from_weight_decay: Sequence[str] = (), name: str = "lars", **kwargs):
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    self.momentum = momentum
    self.lars_weight_decay = weight_decay
    self.eta = eta
    self.nesterov = nesterov
    self.exclude = tuple(exclude_from_weight_decay)

  def build(self, variables):
    if self.built:
      return
    super().build(variables)
    self._momentums = [self.add_variable_from_reference(v, "momentum") for v in variables]
    self._decayed = {self._var_key(v): decays(v, self.exclude) for v in variables}

  def update_step(self, gradient, variable, learning_rate):
    lr = tf.cast(learning_rate, variable.dtype)
    momentum = self._momentums[self._get_variable_index(variable)]
    grad = tf.convert_to_tensor(gradient)
    if self._decayed[self._var_key(variable)]:
      w = tf.convert_to_tensor(variable)
      w_norm = tf.norm(w)
      g_norm = tf.norm(grad)
      trust = tf.where((w_norm > 0) & (g_norm > 0),
                       self.eta * w_norm / (g_norm + self.lars_weight_decay * w_norm),
                       tf.ones_like(w_norm))
      grad = grad + self.lars_weight_decay * w
      step = lr * trust * grad
    else:
      step = lr * grad
    new_momentum = self.momentum * momentum + step
    self.assign(momentum, new_momentum)
    if self.nesterov:
      self.assign_sub(variable, self.momentum * new_momentum + step)
    else:
      self.assign_sub(variable, new_momentum)

  def get_config(self):
    config = super().get_config()
    config.update(momentum=self.momentum, weight_decay=self.lars_weight_decay, eta=self.eta,
                  nesterov=self.nesterov, exclude_from_weight_decay=list(self.exclude))
    return config


class _LayerwiseLearningRates:
  """Mixin: each variable's learning rate times its factor (1 when it has none).

  The factor scales the learning rate given to `update_step` (so the whole
  update of SGD, momentum, Adam, LARS) and the decoupled weight decay
  `w -= lr * factor * wd * w`, as per-group learning rates do in PyTorch. The
  gradient itself, hence its logged norm and its clipping, is not changed.
  """

  _lr_factors = types.MappingProxyType({})

  def set_learning_rate_factors(self, factors: Dict[int, float]) -> None:
    """{`self._var_key(variable)`: factor} for the variables whose factor is not 1."""
    # Read-only and not a dict: the checkpoint's attribute tracking leaves it alone.
    self._lr_factors = types.MappingProxyType(dict(factors))

  def update_step(self, gradient, variable, learning_rate):
    factor = self._lr_factors.get(self._var_key(variable))
    if factor is not None:
      learning_rate = learning_rate * factor
    return super().update_step(gradient, variable, learning_rate)

  def _apply_weight_decay(self, variables):
    if self.weight_decay is None:
      return
    plain = [v for v in variables if self._var_key(v) not in self._lr_factors]
    scaled = [(v, self._lr_factors[self._var_key(v)]) for v in variables
              if self._var_key(v) in self._lr_factors]
    super()._apply_weight_decay(plain)
    if not scaled:
      return

    def decay(distribution, pairs):
      for variable, factor in pairs:
        def decay_one(var, factor=factor):
          if self._use_weight_decay(var):
            rate = tf.cast(self.learning_rate, var.dtype) * factor
            var.assign_sub(var * tf.cast(self.weight_decay, var.dtype) * rate)
        value = variable.value if isinstance(variable, keras.Variable) else variable
        distribution.extended.update(value, decay_one, group=False)

    tf.__internal__.distribute.interim.maybe_merge_call(decay, self._distribution_strategy,
                                                        scaled)


_WITH_FACTORS: Dict[type, type] = {}


def _with_learning_rate_factors(cls: type) -> type:
  """`cls` with `_LayerwiseLearningRates` mixed in (one class per optimizer class)."""
  if cls not in _WITH_FACTORS:
    _WITH_FACTORS[cls] = type(cls.__name__, (_LayerwiseLearningRates, cls), {})
  return _WITH_FACTORS[cls]


def build_optimizer(config: OptimizerConfig, learning_rate, variables: List,
                    lr_multipliers: Optional[Dict[str, float]] = None
                    ) -> keras.optimizers.Optimizer:
  """The optimizer named by `config`, built for `variables`.

  Args:
    config: the optimizer section.
    learning_rate: a float or a schedule.
    variables: the variables it trains (the model's trainable variables).
    lr_multipliers: {variable path: factor} on the learning rate of those
      variables (layer-wise learning rates); None or {} = all 1.
  """
  wd = config.weight_decay or None
  if config.name == "lars":
    cls, kwargs = LARS, dict(momentum=config.momentum, weight_decay=config.weight_decay,
                             eta=config.lars_eta, nesterov=config.nesterov,
                             exclude_from_weight_decay=config.exclude_from_weight_decay)
  elif config.name == "sgd":
    cls, kwargs = SGD, dict(momentum=config.momentum, nesterov=config.nesterov,
                            weight_decay=wd)
  elif config.name == "adamw" and not wd:
    # The same update without a decay term: Keras' AdamW has no "off" (weight_decay=None
    # is rejected) and with 0.0 it still rewrites every variable each step.
    cls, kwargs = keras.optimizers.Adam, dict(beta_1=config.beta_1, beta_2=config.beta_2,
                                              epsilon=config.epsilon)
  elif config.name == "adamw":
    cls, kwargs = keras.optimizers.AdamW, dict(weight_decay=config.weight_decay,
                                               beta_1=config.beta_1, beta_2=config.beta_2,
                                               epsilon=config.epsilon)
  elif config.name == "adafactor":
    cls, kwargs = keras.optimizers.Adafactor, dict(weight_decay=wd)
  elif config.name == "rmsprop":
    cls, kwargs = keras.optimizers.RMSprop, dict(rho=config.rho, momentum=config.momentum,
                                                 epsilon=config.epsilon, weight_decay=wd)
  else:
    raise ConfigError(f"Unknown optimizer {config.name!r}; expected sgd, lars, adamw, adafactor "
                      f"or rmsprop.")
  if lr_multipliers:
    cls = _with_learning_rate_factors(cls)
  optimizer = cls(learning_rate, **kwargs)
  if lr_multipliers:
    unknown = set(lr_multipliers) - {v.path for v in variables}
    if unknown:
      raise ConfigError(f"Learning-rate multipliers for variables the optimizer does not train: "
                        f"{', '.join(sorted(unknown)[:5])}.")
    optimizer.set_learning_rate_factors(
        {optimizer._var_key(v): float(lr_multipliers[v.path])  # pylint: disable=protected-access
         for v in variables if v.path in lr_multipliers})
  if config.name != "lars" and wd:
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in variables if not decays(v, config.exclude_from_weight_decay)])
  optimizer.build(variables)
  return optimizer


def expect_reduced_gradients(optimizer: keras.optimizers.Optimizer) -> None:
  """Makes `optimizer` apply gradients as given, without its own cross-replica sum.

  The common train step sums gradients over replicas once, itself, so that the
  global gradient norm (logged, clipped, checked for overflow) is available
  before the update; Keras would otherwise sum them a second time.
  """
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  inner._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)  # pylint: disable=protected-access
