"""The MirroredStrategy anchor: a training step the benchmarks build with
tf.distribute.MirroredStrategy in graph mode, to compare EPL with."""
import tensorflow.compat.v1 as tf


def train_step(devices, replica_step):
  """(train op, loss averaged over replicas) of MirroredStrategy over
  `devices` (device names), built in the default graph.

  `replica_step(global_step)` builds one replica's loss and train op and
  returns them as (loss, train op); the strategy calls it once per
  replica (call_for_each_replica, as a graph-mode v1 script does)."""
  strategy = tf.distribute.MirroredStrategy(devices=devices)
  with strategy.scope():
    global_step = tf.train.get_or_create_global_step()

    def step_fn():
      loss, train_op = replica_step(global_step)
      with tf.control_dependencies([train_op]):
        return tf.identity(loss)

    per_replica = strategy.extended.call_for_each_replica(step_fn)
    loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica,
                           axis=None)
  return loss.op, loss
