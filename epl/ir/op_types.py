"""Op types EPL treats alike, in one place.

Every module that asks "is this a variable?", "a read of one?", "an input
read?" takes the answer from here, so that an op type added to a list
counts everywhere at once.
"""

# Ops that hold a variable (resource handles and reference variables).
VARIABLE_TYPES = frozenset(["VarHandleOp", "VariableV2", "Variable"])
# Plain reads of a variable's value: a resource read, or the Identity that
# reads a reference variable.
VARIABLE_READ_TYPES = frozenset(["ReadVariableOp", "Identity"])
# Ops that take a resource variable's handle without changing it. (A
# reference variable's readers are told by their definition: see
# epl.parallel.passes.training_subgraph.written_variables.)
RESOURCE_VARIABLE_READERS = frozenset([
    "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
    "VarIsInitializedOp", "_ReadVariablesOp"])
# Ops that write a whole new value into a variable (initialisers, restores).
VARIABLE_ASSIGN_TYPES = frozenset(["AssignVariableOp", "Assign"])
# Ops that take a reference variable by reference without changing it:
# a check, and the v1 control-flow ops that pass the reference on.
REFERENCE_KEEPING_TYPES = frozenset([
    "IsVariableInitialized", "RefIdentity", "RefSwitch", "RefEnter",
    "RefExit", "RefMerge", "RefNextIteration", "RefSelect"])
# Ops whose outputs are their input's buffer, not a copy: a reference
# variable read through them is read when their consumers run.
BUFFER_FORWARDING_TYPES = frozenset([
    "Identity", "RefIdentity", "Switch", "RefSwitch", "Enter", "RefEnter"])
# Ops that read the next element of the input pipeline: each replica (and
# micro-batch) runs its own, on the shared iterator.
INPUT_READ_TYPES = frozenset([
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
    "QueueDequeueV2", "QueueDequeueManyV2", "QueueDequeueUpToV2"])
PLACEHOLDER_TYPES = frozenset(
    ["Placeholder", "PlaceholderV2", "PlaceholderWithDefault"])
# TensorFlow's V2 collectives: keys are inputs, one op per group member.
COLLECTIVE_TYPES = frozenset([
    "CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2",
    "CollectiveBcastSendV2", "CollectiveBcastRecvV2",
    "CollectiveReduceScatterV2"])
# Calls of a function of the graph's library.
FUNCTION_CALL_TYPES = frozenset(["PartitionedCall", "StatefulPartitionedCall"])
# Ops that run function bodies: calls and TF2 control flow.
FUNCTION_BODY_TYPES = FUNCTION_CALL_TYPES | frozenset([
    "If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase"])
# Ops that read only the shape of their input: they keep nothing alive.
SHAPE_READER_TYPES = frozenset(["Shape", "ShapeN", "Size", "Rank"])
# Lookup tables are initialised once by the user's tables_initializer and
# read by every replica.
TABLE_TYPES = frozenset([
    "HashTable", "HashTableV2", "MutableHashTable", "MutableHashTableV2",
    "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2",
    "MutableDenseHashTable", "MutableDenseHashTableV2"])
