"""Data-parallel replicas of the training subgraph."""
from epl.ir import graph_editor
from epl.passes.training_subgraph import INPUT_READ_TYPES

REPLICA_PREFIX = "EPL_REPLICA_%d/"


def _is_host_device(device):
  return "CPU" in device.upper()


def _placement(ctx, op):
  """Where each replica's copy of `op` runs: ("host", None), ("user",
  device) or ("stage", TaskGraph index).

  Input reads run on the worker's CPU. A device the user set that names a
  CPU is kept (host placement is deliberate); any other user device (a
  single-GPU script's `/gpu:0`) gives way to the replica's device.
  """
  user_device = ctx.user_devices.get(op.name, "")
  if op.type in INPUT_READ_TYPES:
    return ("host", None)
  if user_device and _is_host_device(user_device):
    return ("user", user_device)
  return ("stage", ctx.taskgraph_index(op))


def _devices(ctx, local, placements):
  """{op: device} of local replica `local`, from {op: _placement}."""
  host = ctx.host_device(local)
  stages = {}
  devices = {}
  for op, (kind, value) in placements.items():
    if kind == "host":
      devices[op] = host
    elif kind == "user":
      devices[op] = value
    else:
      if value not in stages:
        stages[value] = ctx.device(local, value)
      devices[op] = stages[value]
  return devices


def place_replica_zero(ctx):
  """Pins the user's training ops to the devices of the first local replica.

  Changes the device of every cloned-kind op of the training subgraph (the
  user's ops become replica 0); remembers the devices the user had set in
  `ctx.user_devices`. Keeps names, inputs and every other op as they are.
  """
  for op in ctx.subgraph.cloned:
    ctx.user_devices[op.name] = op.device
  devices = _devices(ctx, 0, {op: _placement(ctx, op)
                              for op in ctx.subgraph.cloned})
  for op, device in devices.items():
    graph_editor.set_device(op, device)
  ctx.clones = [{op.name: op for op in ctx.subgraph.cloned}]


def clone_replicas(ctx):
  """Adds one copy of the training subgraph per further local replica.

  Each copy is named `EPL_REPLICA_<r>/<original name>`, placed on replica
  r's devices, has its own variables, and reads the shared ops (input
  iterators, placeholders, global_step, read-only variables) as they are.
  The user's ops are not changed.
  """
  cloner = graph_editor.Cloner(ctx.graph, ctx.subgraph.cloned)
  placements = {op: _placement(ctx, op) for op in ctx.subgraph.cloned}
  for local in range(1, len(ctx.replicas)):
    prefix = REPLICA_PREFIX % ctx.replicas[local]
    clones = cloner.clone(prefix, _devices(ctx, local, placements).__getitem__)
    ctx.state.copy_tags_to_copies(clones, prefix)
    ctx.clones.append(clones)


def order_input_reads(ctx):
  """Makes the copies of each input read take their batches in order, back
  to back.

  Adds control edges between the copies of each input read, so that the
  batches a step takes from a shared iterator go, in order, to micro-batch
  0 of replicas 0, 1, ..., then to micro-batch 1 of every replica, and so
  on: replica r's micro-batch m gets batch m * replicas + r of the step.
  The ops that read micro-batch m's batches (in every replica) also wait
  for the last read of micro-batch m: TensorFlow's thread pool runs the
  newest ready ops first, so without it a read queued behind the previous
  replica's forward pass waited for most of it (replica 3 of tiny BERT
  started ~90 ms late) and the replicas ran one after another instead of
  side by side. Changes no data edge.
  """
  replicas = len(ctx.replicas)
  for read in ctx.subgraph.input_reads:
    copies = [ctx.op(local, tensor.op)
              for tensor in ctx.micro_batch_tensors(read.outputs[0])
              for local in range(replicas)]
    for previous, current in zip(copies, copies[1:]):
      graph_editor.add_control_inputs(current, [previous])
    for start in range(0, len(copies), replicas):
      group = copies[start:start + replicas]
      for copy in group[:-1]:
        for consumer in dict.fromkeys(
            c for t in copy.outputs for c in t.consumers()):
          graph_editor.add_control_inputs(consumer, [group[-1]])


def join_replicas(ctx):
  """Makes every op the user may fetch to train run every replica's step.

  A shared op (the op `apply_gradients` returned, the global_step
  increment) that reads an op of the cloned part gets control edges from
  that op's copy in every other replica: fetching the user's `train_op`
  then runs the update of every replica. A cloned op that ends the step
  (no op of the step reads it, such as the variable increment a Keras
  optimizer returns as its train op) gets control edges from its own
  copies. Data edges are kept.
  """
  cloned = ctx.subgraph.cloned_names
  for op in ctx.subgraph.joins + ctx.subgraph.shared:
    inputs = [i for i in graph_editor.input_ops(op) if i.name in cloned]
    for local in range(1, len(ctx.replicas)):
      graph_editor.add_control_inputs(op, [ctx.op(local, i) for i in inputs])
  for op in ctx.subgraph.cloned:
    if not any(c.name in cloned for c in graph_editor.output_ops(op)):
      graph_editor.add_control_inputs(
          op, [ctx.op(local, op) for local in range(1, len(ctx.replicas))])
