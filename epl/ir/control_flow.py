"""TF1 control flow (v1): the ops `tf.cond` and `tf.while_loop` build under
`tf.compat.v1.disable_v2_behavior()`, and their contexts.

A v1 while-loop is a frame of ops: Enter ops (all naming the loop's frame
in their `frame_name` attribute) bring values in, Merge/Switch/LoopCond
run the iterations, NextIteration feeds the next one back to the Merge
(the graph's only cycle), Exit ops hand the results out. A v1 cond is a
Switch per input, on the predicate, and a Merge per output. In Python,
each op built in a cond or loop also belongs to a control-flow context
(CondContext, WhileContext), which `tf.gradients` and op creation read.

A copy of such ops (a replica, a micro-batch) must run as its own frame:
each copy's Enter ops name a frame of their own (`<prefix><frame>`), and
the copies get copies of the contexts of their originals.
"""
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from epl.tf_compat import graph_edit

ENTER_TYPES = frozenset(["Enter", "RefEnter"])
EXIT_TYPES = frozenset(["Exit", "RefExit"])
SWITCH_TYPES = frozenset(["Switch", "RefSwitch"])
MERGE_TYPES = frozenset(["Merge", "RefMerge"])
# A v1 while-loop's back edge (NextIteration -> Merge): the loop's only
# cycle.
NEXT_ITERATION_TYPES = frozenset(["NextIteration", "RefNextIteration"])
V1_CONTROL_FLOW_TYPES = (ENTER_TYPES | EXIT_TYPES | SWITCH_TYPES |
                         MERGE_TYPES | NEXT_ITERATION_TYPES |
                         frozenset(["LoopCond"]))

_COLLECTIONS = {"cond": tf.compat.v1.GraphKeys.COND_CONTEXT,
                "while": tf.compat.v1.GraphKeys.WHILE_CONTEXT}


# Building a TF1 while-loop and making existing ops join its frame, as
# epl.tf_compat.graph_edit gives them.
building_v1_control_flow = graph_edit.building_v1_control_flow
control_flow_context = graph_edit.control_flow_context
join_while_context = graph_edit.join_while_context
enter_while_context = graph_edit.enter_while_context
while_control_pivot = graph_edit.while_control_pivot


def forward_input_ops(op):
  """Producers of op's data and control inputs, less a loop's back edge:
  with them, a graph with v1 while-loops is acyclic."""
  inputs = [t.op for t in op.inputs] + list(op.control_inputs)
  if op.type in MERGE_TYPES:
    return [i for i in inputs if i.type not in NEXT_ITERATION_TYPES]
  return inputs


def while_context(op):
  """The innermost v1 while-loop context around `op`, or None."""
  return graph_edit.containing_while_context(op)


def in_loop(op):
  """Whether `op` runs in a v1 while-loop's body or condition."""
  return while_context(op) is not None


def in_cond_branch(op):
  """Whether `op` runs in a branch of a v1 cond (the innermost context
  around it is a cond's, not a loop's): a step runs it only when its
  branch is taken."""
  context = context_of(op)
  return context is not None and while_context(op) is not context


def value_in_loop(tensor):
  """Whether `tensor` is a value of a v1 while-loop's iterations (a loop's
  Exit hands its value out of the loop)."""
  op = tensor.op
  if op.type in EXIT_TYPES:
    return graph_edit.containing_while_context_of(
        while_context(op).outer_context) is not None
  return in_loop(op)


def _outermost_while_context(op):
  context = while_context(op)
  while graph_edit.containing_while_context_of(
      context.outer_context) is not None:
    context = graph_edit.containing_while_context_of(context.outer_context)
  return context


def outermost_loop_exit(op):
  """An Exit of the outermost v1 while-loop around `op`: fetching it runs
  the whole loop (ops inside a loop cannot be fetched)."""
  return _outermost_while_context(op).loop_exits[0].op


def in_rewritten_loop(op, origins):
  """Whether `op` runs in a v1 while-loop that the rewrite built (the
  micro-batch loop of pipeline.accumulation "loop"), by the provenance
  `origins` of the loop's pivot."""
  return in_loop(op) and origins.built_by_rewrite(
      _outermost_while_context(op).pivot.op)


def loop_name(op):
  """The name of the innermost v1 while-loop around `op` (its frame)."""
  return while_context(op).name


def context_of(op):
  """The v1 cond or while context `op` was built in, or None."""
  return graph_edit.control_flow_context(op)


def building_next_to(op):
  """A block in which new ops belong to the control-flow context of `op`
  (where its inputs and outputs live), so that an op inserted between `op`
  and a reader in the same loop or cond branch is built where it runs."""
  return graph_edit.building_in_context(op.graph, context_of(op))


def has_v1_control_flow(graph):
  """Whether `graph` has any v1 cond or while-loop op."""
  return any(op.type in SWITCH_TYPES for op in graph.get_operations())


def conditional_op_names(ops):
  """Names of the ops of `ops` that may not run, or run more than once, in
  a step: those in a v1 while-loop (another frame), those of a v1 cond
  branch, and those downstream of a cond's Switch before its Merge (the
  gradients of a branch, which no context records), which are dead when
  their branch is not taken.

  A control edge may only join ops outside this set: an edge from an op
  in a loop to one outside (or back) crosses frames, which TensorFlow
  refuses, and an op that waits for a dead op is dead too, so an edge
  from a branch would silently skip what waits for it.
  """
  if not ops or not has_v1_control_flow(ops[0].graph):
    return set()
  memo = {}

  def conditional(root):
    # Iterative: an op is conditional when it is in a context, is a
    # Switch, or reads a conditional op other than through a Merge (live
    # when either branch is) or an Exit (live after its loop).
    stack = [root]
    while stack:
      op = stack[-1]
      if op.name in memo:
        stack.pop()
        continue
      if op.type in EXIT_TYPES:
        memo[op.name] = while_context(op).outer_context is not None
      elif context_of(op) is not None or op.type in SWITCH_TYPES:
        memo[op.name] = True
      elif op.type in MERGE_TYPES:
        memo[op.name] = False
      if op.name in memo:
        stack.pop()
        continue
      inputs = forward_input_ops(op)
      pending = [i for i in inputs if i.name not in memo]
      if pending:
        stack.extend(pending)
        continue
      memo[op.name] = any(memo[i.name] for i in inputs)
      stack.pop()
    return memo[root.name]
  # An Exit's output is live after its loop, but the Exit itself runs in
  # the loop's frame.
  return {op.name for op in ops if in_loop(op) or conditional(op)}


def set_frame(enter, frame):
  """The Enter op `enter` starts the frame named `frame`."""
  graph_edit.set_attr(enter, "frame_name",
                      attr_value_pb2.AttrValue(s=frame.encode()))


def _top_level(context):
  while context.outer_context is not None:
    context = context.outer_context
  return context


def top_level_contexts(ops):
  """The outermost v1 contexts of `ops`, in the order first met."""
  found = {}
  for op in ops:
    context = context_of(op)
    if context is not None:
      top = _top_level(context)
      found.setdefault(id(top), top)
  return list(found.values())


def _op_names(values):
  return {value.split(":")[0] for value in values}


def _inner_op_names(context_proto):
  """Names of the ops inside a context's proto (not its external
  values)."""
  values = context_proto.values_def
  return _op_names(set(values.values) - set(values.external_values))


def _structure_names(context_def):
  """Names of the ops a context is built on (pivots, predicate), of
  `context_def` and the contexts nested in it."""
  kind, proto = graph_edit.context_def_kind(context_def)
  names = [proto.pivot_name]
  if kind == "cond":
    names.append(proto.pred_name)
  else:
    names += [proto.pivot_for_pred_name, proto.pivot_for_body_name]
  names = _op_names(names)
  for nested in proto.nested_contexts:
    names |= _structure_names(nested)
  return names


def structure_ops(ops):
  """The ops that the v1 contexts of `ops` are built on (a cond's pivot,
  which nothing may read when its branch has no constant; a loop's
  pivots): a copy of the contexts needs them copied too."""
  result = []
  for context in top_level_contexts(ops):
    names = _structure_names(graph_edit.control_flow_context_def(context))
    result += [ops[0].graph.get_operation_by_name(n) for n in sorted(names)]
  return result


def _keep_copied_values(context_def, copied):
  """Drops from `context_def` (in place, nested contexts too) the ops of the
  context that were not copied (ops of the loop or branch, loop exits and
  enters, that nothing of the training step reads)."""
  kind, proto = graph_edit.context_def_kind(context_def)
  values = proto.values_def
  # An outside value the copies share (a variable every micro-batch
  # reads) is not named `<prefix><name>`: the copy's context does not
  # record it, and reads it through the copied Enter or Switch as before.
  for name, value in dict(values.external_values).items():
    if not _op_names([name, value]) <= copied:
      del values.external_values[name]
  kept = [v for v in values.values if v.split(":")[0] in copied]
  del values.values[:]
  values.values.extend(kept)
  if kind == "while":
    # A loop result nothing reads (a counter's) is not part of the step,
    # nor the gradient loop's entry for it.
    for names in (proto.loop_exit_names, proto.loop_enter_names):
      kept = [n for n in names if n.split(":")[0] in copied]
      del names[:]
      names.extend(kept)
  for nested in proto.nested_contexts:
    _keep_copied_values(nested, copied)


def _corresponding(original, copy, mapping):
  """Adds {id(context): its copy} for `original` and the contexts nested in
  it to `mapping` (a copy nests its copies in the same order)."""
  mapping[id(original)] = copy
  for inner, inner_copy in zip(graph_edit.nested_contexts(original),
                               graph_edit.nested_contexts(copy)):
    _corresponding(inner, inner_copy, mapping)


class ContextCopier:
  """Copies the v1 control-flow contexts of a set of ops for each copy of
  the set (see graph_editor.Cloner)."""

  def __init__(self, ops):
    names = {op.name for op in ops}
    self._in_context = [op for op in ops if context_of(op) is not None]
    self._contexts = []  # (original top-level context, its trimmed proto)
    for context in top_level_contexts(ops):
      context_def = graph_edit.control_flow_context_def(context)
      missing = sorted((_structure_names(context_def) &
                        _inner_op_names(graph_edit.context_def_kind(
                            context_def)[1])) - names)
      _keep_copied_values(context_def, names)
      if missing:
        raise ValueError(
            "EPL copies only part of the TF1 control flow %r: its op(s) %s "
            "would not be copied with the rest. Keep a tf.while_loop or "
            "tf.cond inside one strategy scope (one pipeline stage), or "
            "build it with control flow v2 "
            "(tf.compat.v1.enable_control_flow_v2())." % (
                context.name, ", ".join(missing[:3])))
      self._contexts.append((context, context_def))

  def copy(self, graph, prefix, clones):
    """Gives each copy in `clones` ({original name: copy}, named
    `<prefix><name>`) the copy of its original's context; the copied
    contexts join the graph's cond and while context collections. Ops
    without outputs (a loop's ControlTrigger), which a context's proto
    does not name, get theirs too."""
    mapping = {}
    for context, context_def in self._contexts:
      kind, _ = graph_edit.context_def_kind(context_def)
      copy = graph_edit.context_from_def(graph, context_def,
                                         prefix.rstrip("/"))
      graph.add_to_collection(_COLLECTIONS[kind], copy)
      _corresponding(context, copy, mapping)
    for op in self._in_context:
      graph_edit.set_control_flow_context(clones[op.name],
                                          mapping[id(context_of(op))])


def context_defs(graph):
  """The v1 control-flow contexts of `graph`'s ops (the top-level ones,
  with those nested in them), as ControlFlowContextDef protos: what
  `restore_contexts` needs to give them back to the ops of an import of
  `graph`'s GraphDef, which keeps the ops but not their contexts."""
  return [graph_edit.control_flow_context_def(context)
          for context in top_level_contexts(graph.get_operations())]


def restore_contexts(graph, defs):
  """Gives the ops of `graph` named in `defs` (`context_defs` of the graph
  whose GraphDef was imported into `graph` under the same names) their v1
  contexts back. A `tf.function` importing a v1 loop needs them: its
  automatic control dependencies leave ops in a loop alone, and would
  otherwise make each of the loop's Merges wait for the stateful ops
  built before it, outside its frame ("Merge has inputs from different
  frames")."""
  for context_def in defs:
    graph_edit.context_from_def(graph, context_def, "")
