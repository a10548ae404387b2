"""Automatic mixed precision (amp.level "O1"), memory-efficient.

A rewrite of replica 0's forward and backward ops before micro-batches and
replicas are cloned. Compute-heavy ops (the allow list: matmuls,
convolutions) run in float16 (or bfloat16, amp.dtype); ops of the infer and
clear lists run in half precision too when they lie between two such ops,
so that a chain of layers stays in half precision; every other op (the deny
list: reductions, softmax, exp/log, losses) stays float32. The variables
(master weights) stay float32: each half-precision op that reads a weight
casts it itself, just before use (the cast waits for the op's other
inputs), so no half-precision copy of a weight is kept between uses. The
backward ops of the allow list are converted too, and every gradient is
cast back to float32 before the optimizer, so updates are float32.
"""
import logging

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names
from epl.ir.phase import Phase
from epl.parallel.passes.context import remap_pairs
from epl.parallel.passes.gradient_checkpoint import CHECKPOINTS_COLLECTION
from epl.parallel.plan.decisions import Precision

logger = logging.getLogger("epl")

ALLOW = frozenset([
    "MatMul", "BatchMatMul", "BatchMatMulV2", "Einsum", "Conv2D",
    "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
    "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter"])
# Numerically safe in half precision when their inputs already are.
INFER = frozenset([
    "Add", "AddV2", "AddN", "BiasAdd", "BiasAddGrad", "Mul", "Sub",
    "RealDiv", "Tanh", "TanhGrad", "Sigmoid", "SigmoidGrad", "Elu",
    "EluGrad", "LeakyRelu", "LeakyReluGrad", "Softplus", "SoftplusGrad",
    "Erf", "Sqrt", "Rsqrt", "AvgPool", "AvgPoolGrad", "Square"])
# Move or select values without arithmetic.
CLEAR = frozenset([
    "Identity", "Relu", "Relu6", "ReluGrad", "Relu6Grad", "Reshape",
    "Transpose", "ConcatV2", "Pack", "Unpack", "Split", "SplitV", "Slice",
    "StridedSlice", "StridedSliceGrad", "Squeeze", "ExpandDims", "Tile",
    "Pad", "MaxPool", "MaxPoolGrad", "Neg", "Maximum", "Minimum", "Select",
    "SelectV2", "GatherV2", "ZerosLike", "OnesLike"])
HALF_TYPES = {Precision.FLOAT16: tf.float16, Precision.BFLOAT16: tf.bfloat16}
_WEIGHT_SOURCES = frozenset(["ReadVariableOp", "Const"])


def _arg_positions(op, args):
  """Indices of `op`'s inputs (or outputs) typed by attribute "T"."""
  positions, index = [], 0
  for arg in args:
    if arg.number_attr:
      count = op.get_attr(arg.number_attr)
    elif arg.type_list_attr:
      count = len(op.get_attr(arg.type_list_attr))
    else:
      count = 1
    if arg.type_attr == "T":
      positions.extend(range(index, index + count))
    index += count
  return positions


def _convertible(op):
  """Ops whose only float type is attribute T, set to float32."""
  try:
    if op.get_attr("T") != tf.float32:
      return False
  except ValueError:
    return False
  return not any(a.type == "type" and a.name != "T" and
                 op.get_attr(a.name) in (tf.float32, tf.float16, tf.bfloat16)
                 for a in op.op_def.attr)


def _reach(start, among, step):
  """Names of ops of `among` reached from `start` by `step`, through ops
  of the infer and clear lists."""
  seen = set()
  stack = [n for op in start for n in step(op)]
  while stack:
    op = stack.pop()
    if op.name in seen or op.name not in among or op.type in ALLOW:
      continue
    seen.add(op.name)
    stack.extend(step(op))
  return seen


def paint(ops):
  """Names of the ops of `ops` to run in half precision: allow-list ops,
  and infer/clear-list ops both downstream and upstream of them."""
  candidates = {op.name: op for op in ops if _convertible(op)}
  allowed = [op for op in candidates.values() if op.type in ALLOW]
  between = {n for n, op in candidates.items()
             if op.type in INFER or op.type in CLEAR}
  downstream = _reach(allowed, between,
                      lambda op: [c for t in op.outputs
                                  for c in t.consumers()])
  upstream = _reach(allowed, between, lambda op: [t.op for t in op.inputs])
  return {op.name for op in allowed} | (downstream & upstream)


def _is_weight(tensor):
  op = tensor.op
  if op.type == "Identity":
    return bool(op.inputs) and graph_editor.is_ref_dtype(op.inputs[0].dtype)
  return op.type in _WEIGHT_SOURCES


class _Converter:
  """Builds the half-precision copies of the painted ops of one graph."""

  def __init__(self, ctx, user_devices, painted, dtype):
    self.ctx = ctx
    self.user_devices = user_devices
    self.painted = painted
    self.dtype = dtype
    self.half = {}      # float32 tensor name -> half tensor
    self.copies = {}    # painted op name -> its half copy
    self.casts = {}     # activation casts, shared by their consumers
    self.built = []
    self.log = logger.info if ctx.config.amp.debug_log else logger.debug

  def _keep(self, op, like):
    self.ctx.state.copy_tags(like, op)
    self.user_devices[op.name] = self.user_devices.get(like.name, "")
    self.built.append(op)
    return op

  def _weight_cast(self, tensor, consumer, index, others):
    """A weight's cast for `consumer` alone, made just before it runs (it
    waits for `others`, the consumer's other inputs), so no half copy of
    the weight lives between uses."""
    with tf.device(consumer.device), control_flow.building_next_to(consumer):
      cast = tf.cast(tensor, self.dtype, name=names.half_precision(
          consumer.name, "cast_%d" % index))
    graph_editor.add_control_inputs(cast.op, others)
    self._keep(cast.op, consumer)
    return cast

  def _cast(self, tensor, consumer):
    """An activation in half precision: the painted producer's output, or
    one cast per consumer device, with the consumer's TaskGraph, phase and
    micro-batch (an input read outside every strategy is not part of a
    micro-batch; its cast must be)."""
    if tensor.name in self.half:
      return self.half[tensor.name]
    if tensor.dtype == self.dtype:
      return tensor
    key = (tensor.name, consumer.device, self.ctx.taskgraph_index(consumer),
           id(control_flow.context_of(consumer)))
    if key not in self.casts:
      with tf.device(consumer.device), control_flow.building_next_to(
          consumer):
        cast = tf.cast(tensor, self.dtype, name=names.half_precision(
            tensor.op.name, "cast_" + self.dtype.name))
      self.casts[key] = self._keep(cast.op, consumer).outputs[0]
    return self.casts[key]

  def convert(self, op):
    """A half-precision copy of `op`, reading half inputs."""
    typed = set(_arg_positions(op, op.op_def.input_arg))
    weights = [i for i in typed if _is_weight(op.inputs[i]) and
               op.inputs[i].name not in self.half]
    inputs = [self._cast(t, op) if i in typed and i not in weights else t
              for i, t in enumerate(op.inputs)]
    others = [t.op for i, t in enumerate(inputs) if i not in weights]
    for i in weights:
      inputs[i] = self._weight_cast(op.inputs[i], op, i, others)
    outputs = set(_arg_positions(op, op.op_def.output_arg))
    attrs = {k: v for k, v in op.node_def.attr.items() if k != "_class"}
    attrs["T"] = attr_value_pb2.AttrValue(type=self.dtype.as_datatype_enum)
    with control_flow.building_next_to(op):
      copy = graph_editor.create_op(
          self.ctx.graph, op.type, inputs,
          dtypes=[self.dtype if i in outputs else t.dtype
                  for i, t in enumerate(op.outputs)],
          name=names.half_precision(op.name, self.dtype.name), attrs=attrs,
          op_def=op.op_def)
    graph_editor.set_device(copy, op.device)
    self.ctx.state.provenance.record_copy(copy, op,
                                          replica=self.ctx.replicas[0])
    graph_editor.add_control_inputs(
        copy, [self.copies.get(c.name, c) for c in op.control_inputs])
    self.copies[op.name] = copy
    self._keep(copy, op)
    for i in outputs:
      self.half[op.outputs[i].name] = copy.outputs[i]
    self.log("AMP: %s (%s) runs in %s", op.name, op.type, self.dtype.name)
    return copy

  def reroute(self, op, copy):
    """Consumers of `op` that stay float32 read its copy's outputs cast
    back; ops that waited for `op` wait for the copy."""
    remapped = {}
    for tensor, new in zip(op.outputs, copy.outputs):
      readers = [c for c in tensor.consumers() if c.name not in self.painted]
      if not readers:
        continue
      if new.dtype != tensor.dtype:
        with tf.device(op.device), control_flow.building_next_to(op):
          new = tf.cast(new, tensor.dtype, name=names.half_precision(
              op.name, "float32"))
        self._keep(new.op, op)
      graph_editor.replace_input_in(readers, tensor, new)
      remapped[tensor.name] = new
    for waiting in list(graph_editor.control_outputs(op)):
      controls = [copy if c is op else c for c in waiting.control_inputs]
      graph_editor.remove_all_control_inputs(waiting)
      graph_editor.add_control_inputs(waiting, controls)
    return remapped


def convert_to_half(ctx, subgraph, gradients, gradient_points, copies,
                    user_devices):
  """Runs the painted ops of replica 0 in half precision (amp.level O1).

  Each painted op (see `paint`) of the cloned subgraph's forward and
  backward ops is replaced by a copy named `<name>_EPL_AMP_<dtype>` with
  T = half, on the same device and TaskGraph; its inputs are cast (weights
  per consumer, just before use), float32 consumers read its outputs cast
  back (`<name>_EPL_AMP_float32`), and the gradients, gradient points and
  the "checkpoints" collection follow. The replaced ops leave the cloned
  subgraph (nothing reads them); each copy's provenance names the op it
  replaces. Variables, the optimizer and unpainted ops keep their dtype.
  The copies and casts of ops in a TF1 cond or while-loop are built in its
  control-flow context, where they run.
  """
  dtype = HALF_TYPES[ctx.plan.decisions.precision.value]
  state = ctx.state
  ops = [op for op in subgraph.cloned
         if state.phase_of(op) in (Phase.FORWARD, Phase.BACKWARD)]
  painted = paint(ops)
  converter = _Converter(ctx, user_devices, painted, dtype)
  remapped = {}
  with ctx.building(""):
    half_copies = [(op, converter.convert(op)) for op in ops
                   if op.name in painted]
    for op, copy in half_copies:
      remapped.update(converter.reroute(op, copy))
  # Checkpoints of gradient checkpointing name the half activations now.
  checkpoints = ctx.graph.get_collection_ref(CHECKPOINTS_COLLECTION)
  checkpoints[:] = [converter.half.get(getattr(t, "name", None), t)
                    for t in checkpoints]
  for name in painted:
    copies.clones[0].pop(name, None)
  copies.clones[0].update({op.name: op for op in converter.built})
  logger.info("AMP O1 (%s): %d of %d forward/backward ops run in %s",
              dtype.name, len(painted), len(ops), dtype.name)
  return {"subgraph": subgraph.without(painted).adding(converter.built),
          "gradients": gradients.remapped(remapped),
          "gradient_points": [remap_pairs(points, remapped)
                              for points in gradient_points],
          "copies": copies, "user_devices": user_devices}
