"""Data-parallel replicas of the training subgraph."""
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names
from epl.ir.op_types import COLLECTIVE_TYPES, INPUT_READ_TYPES
from epl.parallel.passes.context import Copies


def _is_host_device(device):
  return "CPU" in device.upper()


def _placement(ctx, user_devices, op):
  """Where each replica's copy of `op` runs: ("host", None), ("user",
  device) or ("stage", TaskGraph index).

  Input reads run on the worker's CPU. A device the user set that names a
  CPU is kept (host placement is deliberate); any other user device (a
  single-GPU script's `/gpu:0`) gives way to the replica's device.
  """
  user_device = user_devices.get(op.name, "")
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


def place_replica_zero(ctx, subgraph):
  """Pins the user's training ops to the devices of the first local replica.

  Changes the device of every cloned-kind op of the training subgraph (the
  user's ops become replica 0); hands on the devices the user had set
  (`user_devices`) and the copy map of replica 0 (`copies`, identity).
  Keeps names, inputs and every other op as they are.
  """
  user_devices = {op.name: op.device for op in subgraph.cloned}
  devices = _devices(ctx, 0, {op: _placement(ctx, user_devices, op)
                              for op in subgraph.cloned})
  for op, device in devices.items():
    graph_editor.set_device(op, device)
  return {"copies": Copies([{op.name: op for op in subgraph.cloned}]),
          "user_devices": user_devices}


def clone_replicas(ctx, subgraph, copies, user_devices):
  """Adds one copy of the training subgraph per further local replica.

  Each copy is named `EPL_REPLICA_<r>/<original name>`, placed on replica
  r's devices, has its own variables, and reads the shared ops (input
  iterators, placeholders, global_step, read-only variables) as they are;
  it gets the tags of what it copies, and its provenance (replica r, the
  micro-batch of what it copies). The user's ops are not changed.
  """
  state = ctx.state
  cloner = graph_editor.Cloner(ctx.graph, subgraph.cloned)
  placements = {op: _placement(ctx, user_devices, op)
                for op in subgraph.cloned}
  for local in range(1, len(ctx.replicas)):
    prefix = names.replica_prefix(ctx.replicas[local])
    clones = cloner.clone(prefix, _devices(ctx, local, placements).__getitem__,
                          provenance=state.provenance,
                          replica=ctx.replicas[local],
                          micro_batch=state.micro_batch_tags())
    state.copy_tags_to_copies(clones, prefix)
    copies.clones.append(clones)
  return {"copies": copies}


def order_input_reads(ctx, captured_step, copies):
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
  for read in captured_step.input_reads:
    reads = [copies.op(local, op) for op in copies.micro_batch_ops(read)
             for local in range(replicas)]
    for previous, current in zip(reads, reads[1:]):
      graph_editor.add_control_inputs(current, [previous])
    for start in range(0, len(reads), replicas):
      group = reads[start:start + replicas]
      for copy in group[:-1]:
        for consumer in dict.fromkeys(
            c for t in copy.outputs for c in t.consumers()):
          graph_editor.add_control_inputs(consumer, [group[-1]])


def join_replicas(ctx, captured_step, subgraph, copies):
  """Makes every op the user may fetch to train run every replica's step.

  A shared op (the op `apply_gradients` returned, the global_step
  increment) that reads an op of the cloned part gets control edges from
  that op's copy in every other replica: fetching the user's `train_op`
  then runs the update of every replica. A cloned op that ends the step
  (no op of the step reads it, such as the variable increment a Keras
  optimizer returns as its train op) gets control edges from its own
  copies (a collective excepted: its copies complete together). Data
  edges are kept. Ops in a TF1 while-loop neither get nor
  give such edges (frames), nor do ops in a cond branch give them to ops
  outside it (control_flow.conditional_op_names): their loop or cond runs
  with the ops around it.
  """
  cloned = subgraph.cloned_names
  conditional = control_flow.conditional_op_names(
      list(captured_step.joins + captured_step.shared) + subgraph.cloned)
  for op in captured_step.joins + captured_step.shared:
    if control_flow.in_loop(op):
      continue
    # A shared op in a cond branch (the global_step increment of TF's
    # loss-scale optimizer) waits for the copies of its inputs in the same
    # branch of every replica: the replicas decide alike, on all-reduced
    # gradients.
    inputs = [i for i in graph_editor.input_ops(op)
              if i.name in cloned and not control_flow.in_loop(i) and
              (i.name not in conditional or op.name in conditional)]
    for local in range(1, len(ctx.replicas)):
      graph_editor.add_control_inputs(op,
                                      [copies.op(local, i) for i in inputs])
  for op in subgraph.cloned:
    # A collective's copies are one group: each waits for the others, so
    # none may wait for the others to finish first (a split head's argmax,
    # which nothing of the step reads). Runs that reach one run all
    # (epl.runtime.collective_groups).
    if op.name in conditional or op.type in COLLECTIVE_TYPES:
      continue
    if not any(c.name in cloned for c in graph_editor.output_ops(op)):
      graph_editor.add_control_inputs(
          op, [copies.op(local, op) for local in range(1, len(ctx.replicas))])
