# EPL quick start: a two-layer model on random data, data parallel over every
# device. Without GPUs: EPL_CLUSTER_NUM_CPU_DEVICES=4 python examples/quick_start/train.py
import numpy as np
import tensorflow as tf
import epl

tf.compat.v1.disable_eager_execution()  # a TF1 script, as without EPL
epl.init()                                               # EPL
epl.set_default_strategy(epl.replicate(device_count=1))  # EPL

rng = np.random.RandomState(0)
features = rng.randint(0, 10, (500, 20)).astype(np.float32)
labels = (features.sum(axis=1) // 20).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(10)
x, y = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.dense(x, 16, tf.nn.relu), 10)
loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits)
step = tf.compat.v1.train.get_or_create_global_step()
train_op = tf.compat.v1.train.MomentumOptimizer(1e-3, 0.9).minimize(loss, global_step=step)
with tf.compat.v1.train.MonitoredTrainingSession(
    hooks=[tf.compat.v1.train.StopAtStepHook(last_step=20)]) as sess:
  while not sess.should_stop():
    _, loss_value, step_value = sess.run([train_op, loss, step])
    print("Iteration %d, loss: %.4f" % (step_value, loss_value))
