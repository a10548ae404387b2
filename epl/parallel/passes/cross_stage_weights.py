"""A weight that a stage on another device reads (BERT's word embeddings,
tied to the masked-LM output): read once a step and its gradient summed
over the micro-batches on the reading device, so that it crosses between
the devices once each way per step, not once per micro-batch
(docs/traffic.md, "Pipeline").

The variable does not change during a step's micro-batches (the update
runs after the last), so one read serves them all; the sum of the
micro-batches' gradients is the same sum, added in another order.
The plan decides it (`decisions.CrossStageWeights`): ZeRO v2 and v3 send
each micro-batch's gradient to its owner and gather each weight where it
is used, so they keep a read and a gradient per micro-batch.
"""
import tensorflow as tf

from epl.ir import transfers
from epl.ir.op_types import VARIABLE_READ_TYPES, VARIABLE_TYPES
from epl.ir.phase import Phase
from epl.parallel.plan.decisions import CrossStageWeights


def _device(op):
  return transfers.canonical_device(op.device)


def _applies(ctx):
  return ctx.plan.decisions.cross_stage_weights.value is (
      CrossStageWeights.ONCE_A_STEP)


def _used_on_another_device(read, names):
  """Whether the value of variable read `read` is used on another device
  than the variable's: the read is there (a resource variable's
  ReadVariableOp, made where its reader is), or one of its consumers
  among `names` is (a reference variable's Identity, which TensorFlow
  colocates with the variable and every reader shares)."""
  where = _device(read.inputs[0].op)
  return _device(read) != where or any(
      _device(consumer) != where for consumer in read.outputs[0].consumers()
      if consumer.name in names)


def reads_of_other_devices(ctx, ops):
  """{name: op} of the reads among `ops` (replica 0's, placed) of a
  variable whose value is used on another device: every micro-batch
  reads them as they are, so the value crosses once a step."""
  if not _applies(ctx):
    return {}
  names = {op.name for op in ops}
  return {op.name: op for op in ops
          if op.type in VARIABLE_READ_TYPES and op.inputs and
          op.inputs[0].op.type in VARIABLE_TYPES and
          _used_on_another_device(op, names)}


def _sum_device(grad, readers):
  """The op whose device and stage sum `grad`'s parts: its one reader
  outside the micro-batches (the update, where the variable is), else
  the AddN itself."""
  if len({_device(op) for op in readers}) == 1:
    return readers[0]
  return grad.op


def parts_on_other_devices(ctx, grad, readers):
  """(parts, op whose device sums them): the inputs of dense gradient
  `grad` when it is the AddN of parts of which some were made on another
  device than the op that reads it (`readers`, outside the micro-batches)
  (the gradients of a weight read by two stages), else None."""
  if (not _applies(ctx) or isinstance(grad, tf.IndexedSlices) or
      grad.op.type != "AddN"):
    return None
  where = _sum_device(grad, readers)
  if all(_device(part.op) == _device(where) for part in grad.op.inputs):
    return None
  return list(grad.op.inputs), where


def sum_parts(ctx, grad, where, sums, copies, built):
  """The sum over the micro-batches of AddN `grad`, given `sums` (each
  of its parts summed over the micro-batches on the part's device): their
  AddN on the device and stage of op `where`, in the backward of the last
  micro-batch, appended to `built`. The AddN of each micro-batch (`grad`
  and its `copies`, {name: copy} per further micro-batch), which nothing
  reads any more, leaves its micro-batch: the schedule runs what its
  micro-batches hold."""
  state, source = ctx.state, grad.op
  with tf.device(where.device), tf.name_scope(source.name):
    total = tf.math.add_n(sums, name="over_micro_batches")
  state.tag(total.op, state.taskgraph_of(where), Phase.BACKWARD,
            len(copies))
  built.append(total.op)
  for op in [source] + [clones[source.name] for clones in copies]:
    state.set_micro_batch(op, None)
  return total
