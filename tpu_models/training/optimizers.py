"""Optimizers from `OptimizerConfig`, and the weight-decay exclusion rule.

SGD (momentum, Nesterov), LARS, AdamW and Adafactor. Vectors (biases, batch-norm
gamma/beta) and variables whose path contains an `exclude_from_weight_decay`
substring are excluded from weight decay, the coupled L2 penalty and LARS'
layer-wise trust ratio, as in the published large-batch recipes.
"""

from typing import List, Sequence

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


def build_optimizer(config: OptimizerConfig, learning_rate,
                    variables: List) -> keras.optimizers.Optimizer:
  """The optimizer named by `config`, built for `variables`."""
  wd = config.weight_decay or None
  if config.name == "lars":
    optimizer = LARS(learning_rate, momentum=config.momentum, weight_decay=config.weight_decay,
                     eta=config.lars_eta, nesterov=config.nesterov,
                     exclude_from_weight_decay=config.exclude_from_weight_decay)
  elif config.name == "sgd":
    optimizer = SGD(learning_rate, momentum=config.momentum, nesterov=config.nesterov,
                    weight_decay=wd)
  elif config.name == "adamw" and not wd:
    # The same update without a decay term: Keras' AdamW has no "off" (weight_decay=None
    # is rejected) and with 0.0 it still rewrites every variable each step.
    optimizer = keras.optimizers.Adam(learning_rate, beta_1=config.beta_1,
                                      beta_2=config.beta_2, epsilon=config.epsilon)
  elif config.name == "adamw":
    optimizer = keras.optimizers.AdamW(learning_rate, weight_decay=config.weight_decay,
                                       beta_1=config.beta_1, beta_2=config.beta_2,
                                       epsilon=config.epsilon)
  elif config.name == "adafactor":
    optimizer = keras.optimizers.Adafactor(learning_rate, weight_decay=wd)
  else:
    raise ConfigError(f"Unknown optimizer {config.name!r}; expected sgd, lars, adamw or adafactor.")
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
