"""ZeRO v3's gradient shards: shard s's rows of the gradient of a
partitioned weight, summed over replicas (and micro-batches), made without
a full-size gradient on any replica where the op that makes it allows.

The gradient of a dense layer's kernel is `MatMul(x, dy, transpose_a)`,
and its sum over replicas is one MatMul over their concatenated batches.
Where the plan chose that route for a weight (GradientShards
FROM_ACTIVATIONS, `epl.parallel.plan.gradient_shards`: it moves fewer
bytes there), shard s's summed rows are one MatMul, on shard s's device,
of the same columns of every replica's `x` with every `dy`
(`summed_shards`): only those slices and the activations' gradients
travel, and no replica makes the full gradient nor its N slices.
Otherwise (FROM_GRADIENTS) each replica makes each shard's rows and sends
them to the shard (`shards_of`): where a MatMul makes the gradient, as
its own MatMul of 1/N the size; any other gradient (one made by another
op, or read by more than its update: clipping, summaries) is sliced
after it is made. The gate `minimize` puts on the gradients of one op
(tf.tuple: every gradient of the MatMul waits for all of them) then
waits for the input gradient only; the shard products wait for the
gates, so each shard's update still runs after the backward pass read
the weight.
"""
import dataclasses

import tensorflow as tf

from epl.ir import graph_editor
from epl.ir.kernel_gradients import is_kernel_gradient, product_behind
from epl.parallel.passes.split_checkpoint import shard_slice


def shards_of(tensor, info, rank, leaving):
  """[shard s's rows of gradient `tensor` for s in range(N)] (the
  unsharded shape's tensor `tensor`, ShardedVariable `info`, rank
  `rank`), built on its device: MatMuls of slices of the inputs of the
  MatMul that makes it, where only the ops named in `leaving` read it
  (see the module's note), else slices of `tensor`."""
  product = product_behind(tensor, leaving) if info.axis == 0 else None
  with tf.device(tensor.device):
    if product is None:
      return [shard_slice(tensor, info, shard, rank)
              for shard in range(info.group_size)]
    matmul, gates = product
    for gate in gates:
      graph_editor.remove_control_input(gate, matmul)
    transpose_a = matmul.get_attr("transpose_a")
    # The rows of the product are the columns of a transposed `a`.
    rows_of_a = dataclasses.replace(info, axis=1 if transpose_a else 0)
    with tf.control_dependencies([g for g in gates if g is not matmul]):
      return [tf.linalg.matmul(
          shard_slice(matmul.inputs[0], rows_of_a, shard, 2),
          matmul.inputs[1], transpose_a=transpose_a,
          transpose_b=matmul.get_attr("transpose_b"))
              for shard in range(info.group_size)]


def summed_shards(tensors, info, leaving, devices):
  """[shard s's rows of the sum of `tensors` (every replica's gradient of
  one kernel, of every micro-batch), built on `devices[s]`] as one MatMul
  per shard of the columns of every `x` it needs, concatenated along the
  batch, with every `dy`: the sum over replicas and micro-batches is the
  product over their concatenated batches. Only the slices of `x` travel,
  and the activations' gradients. None unless each tensor is made by a
  kernel gradient `MatMul(x, dy, transpose_a=True)` that only the ops
  named in `leaving` read."""
  products = [product_behind(t, leaving) for t in tensors]
  if info.axis != 0 or any(
      p is None or not is_kernel_gradient(p[0]) for p in products):
    return None
  gates = []
  for matmul, own_gates in products:
    for gate in own_gates:
      graph_editor.remove_control_input(gate, matmul)
    gates.extend(g for g in own_gates if g is not matmul)
  columns = dataclasses.replace(info, axis=1)
  summed = []
  for shard, device in enumerate(devices):
    slices = []
    for matmul, _ in products:
      with tf.device(matmul.device):
        slices.append(shard_slice(matmul.inputs[0], columns, shard, 2))
    with tf.device(device), tf.control_dependencies(gates):
      summed.append(tf.linalg.matmul(
          tf.concat(slices, 0),
          tf.concat([m.inputs[1] for m, _ in products], 0),
          transpose_a=True))
  return summed
