"""optimizer.num_apply_group: the update applied in groups, one after another.

An optimizer's update allocates temporary buffers per variable; when every
variable is updated at once, all of them are alive together. Applying the
update in k size-balanced groups, each waiting (control edges) for the
previous one, keeps only one group's buffers alive. `global_step` and the
optimizer's finish step (Adam's beta powers) run once, after the last
group. This happens where the user calls `apply_gradients` (forwarded from
`epl.hooks`); the rewrite then replicates the grouped update like any
other (`check_grouped` warns about updates that were not grouped).
"""
import logging

import tensorflow as tf

from epl.parallel.plan.balance import balanced_partition, variable_size
from epl.tf_compat import training

logger = logging.getLogger("epl")

# Graph collection of the ops grouped updates returned.
GROUPED_COLLECTION = "epl_grouped_apply"


def _groupable(optimizer):
  """A tf.compat.v1.train.Optimizer whose apply_gradients is the base one
  (any subclass that keeps it: its per-variable updates and `_finish` are
  the base class's protocol)."""
  return (isinstance(optimizer, tf.compat.v1.train.Optimizer) and
          type(optimizer).apply_gradients is
          tf.compat.v1.train.Optimizer.apply_gradients)


class _BaseFinish:
  """Within the block, `optimizer._finish` is the base class's (it only
  groups the update ops), so that Adam's beta powers are not advanced."""

  def __init__(self, optimizer):
    self._optimizer = optimizer
    self._own = optimizer.__dict__.get("_finish")

  def __enter__(self):
    self._optimizer._finish = training.base_finish(self._optimizer)  # pylint: disable=protected-access

  def __exit__(self, *exc):
    if self._own is None:
      del self._optimizer._finish  # pylint: disable=protected-access
    else:
      self._optimizer._finish = self._own  # pylint: disable=protected-access


def apply_gradients(original, optimizer, grads_and_vars, global_step, name,
                    num_groups):
  """`original(optimizer, ...)`, in `num_groups` groups when asked.

  The (gradient, variable) pairs are cut into size-balanced groups (by
  variable elements); each group's apply_gradients is built under a
  control dependency on the previous group's update; only the last gets
  `global_step`, the user's `name` and the optimizer's own finish step.
  Returns the last group's op, which waits for every group.
  """
  pairs = [(g, v) for g, v in grads_and_vars if g is not None]
  if num_groups <= 1 or len(pairs) < 2 or not _groupable(optimizer):
    return original(optimizer, grads_and_vars, global_step=global_step,
                    name=name)
  parts = [p for p in balanced_partition(
      [variable_size(v.op) for _, v in pairs], num_groups) if p]
  base_name = name or optimizer.get_name()
  logger.debug("Applying %d gradients in %d groups of %s elements", len(pairs),
               len(parts), [sum(variable_size(pairs[i][1].op) for i in p)
                            for p in parts])
  previous = None
  for index, part in enumerate(parts):
    group = [pairs[i] for i in part]
    last = index == len(parts) - 1
    with tf.control_dependencies([previous] if previous is not None else None):
      if last:
        previous = original(optimizer, group, global_step=global_step,
                            name=name)
      else:
        with _BaseFinish(optimizer):
          previous = original(optimizer, group, global_step=None,
                              name="%s_group_%d" % (base_name, index))
  previous.graph.add_to_collection(GROUPED_COLLECTION, previous)
  return previous


def check_grouped(ctx, captured_step):
  """Warns once when optimizer.num_apply_group > 1 did not group an update.

  Grouping needs a tf.compat.v1.train.Optimizer that keeps the base
  class's apply_gradients; any other update (and one with a single
  variable) is applied normally. Changes nothing in the graph.
  """
  num_groups = ctx.config.optimizer.num_apply_group
  grouped = {op.name for op in ctx.graph.get_collection(GROUPED_COLLECTION)}
  ungrouped = [r.train_op.name for r in captured_step.apply_records
               if r.train_op.name not in grouped and len(r.grads_and_vars) > 1]
  if ungrouped:
    logger.warning(
        "optimizer.num_apply_group = %d: the update %s was applied in one "
        "group. Grouping works for tf.compat.v1.train.Optimizer subclasses "
        "that keep its apply_gradients.", num_groups, ", ".join(ungrouped))
  else:
    logger.info("optimizer.num_apply_group: %d update(s) applied in up to %d "
                "groups", len(captured_step.apply_records), num_groups)
