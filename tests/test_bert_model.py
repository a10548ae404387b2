"""Tests of the BERT example (examples/bert_large) in plain TensorFlow.

No test here imports epl: the EPL code paths of train.py are only checked
against a recording stand-in module.
"""

import contextlib
import glob
import os
import sys
import types

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from examples.bert_large import create_pretraining_data as cpd  # noqa: E402
from examples.bert_large import input_pipeline  # noqa: E402
from examples.bert_large import modeling  # noqa: E402
from examples.bert_large import optimization  # noqa: E402
from examples.bert_large import train  # noqa: E402

from tests import tolerance  # noqa: E402


def _placeholder_features(batch, seq, preds):
  return dict(
      input_ids=tf.zeros([batch, seq], tf.int32),
      input_mask=tf.ones([batch, seq], tf.int32),
      segment_ids=tf.zeros([batch, seq], tf.int32),
      masked_lm_positions=tf.zeros([batch, preds], tf.int32),
      masked_lm_ids=tf.zeros([batch, preds], tf.int32),
      masked_lm_weights=tf.ones([batch, preds], tf.float32),
      next_sentence_labels=tf.zeros([batch], tf.int32))


# --------------------------------------------------------------------------
# model graph


@pytest.mark.parametrize("name,low,high", [
    ("tiny", 0.4e6, 0.8e6),
    ("base", 108e6, 112e6),
    ("large", 330e6, 345e6),
])
def test_model_graph_builds(name, low, high):
  config = modeling.BertConfig.from_name(name)
  with tf.Graph().as_default():
    out = modeling.build_pretraining_model(
        config, _placeholder_features(2, 16, 3), is_training=True)
    n = modeling.count_parameters()
    assert low <= n <= high, n
    assert out["total_loss"].shape.ndims == 0
    assert out["sequence_output"].shape.as_list() == [2, 16, config.hidden_size]
    names = {v.op.name for v in tf.trainable_variables()}
    assert "bert/embeddings/word_embeddings" in names
    assert ("bert/encoder/layer_%d/output/LayerNorm/gamma"
            % (config.num_hidden_layers - 1)) in names
    assert "cls/predictions/output_bias" in names
    assert "cls/seq_relationship/output_weights" in names
    assert len(names) == 5 + 16 * config.num_hidden_layers + 2 + 5 + 2


def test_presets():
  large = modeling.BertConfig.large()
  assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads,
          large.intermediate_size, large.vocab_size) == (24, 1024, 16, 4096,
                                                         30522)
  base = modeling.BertConfig.base()
  assert (base.num_hidden_layers, base.hidden_size,
          base.num_attention_heads) == (12, 768, 12)
  tiny = modeling.BertConfig.tiny(num_hidden_layers=4)
  assert tiny.num_hidden_layers == 4 and tiny.hidden_size == 128
  with pytest.raises(ValueError):
    modeling.BertConfig.from_name("huge")


def test_full_train_graph_tiny_and_tied_embedding_gradient():
  with tf.Graph().as_default():
    h = train.build_graph(train.make_flags(config="tiny", steps=10))
    assert h["num_replicas"] == 1 and h["global_batch_size"] == 8
    assert h["train_op"] is not None
    # The tied word-embedding table is used by the gather (sparse gradient)
    # and by the MLM output layer (dense gradient).
    table = h["outputs"]["embedding_table"]
    grad = tf.gradients(h["loss"], [table])[0]
    assert grad is not None


# --------------------------------------------------------------------------
# pipeline stage scopes


def _record_parts(config, stage_of):
  """Builds the model with a recording stage_scope.

  Returns (parts in call order, {op name: stage}) for the ops built inside a
  part; raises if parts nest.
  """
  calls, op_stage = [], {}
  state = {"open": False}

  @contextlib.contextmanager
  def recording_scope(part):
    assert not state["open"], "stage scopes must not nest"
    calls.append(part)
    graph = tf.get_default_graph()
    before = len(graph.get_operations())
    state["open"] = True
    try:
      yield
    finally:
      state["open"] = False
      for op in graph.get_operations()[before:]:
        op_stage[op.name] = stage_of(part)

  modeling.build_pretraining_model(
      config, _placeholder_features(2, 8, 2), is_training=True,
      stage_scope=recording_scope)
  return calls, op_stage


@pytest.mark.parametrize("num_stages,expected_layer_stages", [
    (2, [0, 0, 1, 1]),
    (4, [0, 1, 2, 3]),
])
def test_stage_scope_parts(num_stages, expected_layer_stages):
  config = modeling.BertConfig.tiny(num_hidden_layers=4)
  assert train.layer_stages(4, num_stages) == expected_layer_stages

  def stage_of(part):
    return train.stage_of_part(part, 4, num_stages)

  with tf.Graph().as_default() as graph:
    calls, op_stage = _record_parts(config, stage_of)
    assert calls == ["embeddings", ("encoder", 0), ("encoder", 1),
                     ("encoder", 2), ("encoder", 3), "heads"]
    assert [stage_of(p) for p in calls] == (
        [0] + expected_layer_stages + [num_stages - 1])
    # Every model op is in some part, and data only flows forward.
    model_ops = [op for op in graph.get_operations()
                 if op.name not in op_stage]
    assert all(op.type in ("Const", "Fill") or op.name.startswith("zeros")
               or op.name.startswith("ones") for op in model_ops), [
                   op.name for op in model_ops]
    for op in graph.get_operations():
      if op.name not in op_stage:
        continue
      for t in list(op.inputs) + list(op.control_inputs):
        src = t.op if hasattr(t, "op") else t
        if src.name in op_stage:
          assert op_stage[src.name] <= op_stage[op.name], (src.name, op.name)
    # The MLM head reads the word-embedding table made in stage 0.
    reads = [op for op in graph.get_operations()
             if op.type == "ReadVariableOp" and op_stage.get(op.name) ==
             num_stages - 1 and op.inputs[0].op.name ==
             "bert/embeddings/word_embeddings"]
    assert reads


def test_stage_split_uneven_and_errors():
  assert train.layers_per_stage(5, 3) == [2, 2, 1]
  assert train.layer_stages(24, 5) == ([0] * 5 + [1] * 5 + [2] * 5 +
                                       [3] * 5 + [4] * 4)
  assert train.stage_of_part("embeddings", 24, 4) == 0
  assert train.stage_of_part("heads", 24, 4) == 3
  with pytest.raises(ValueError):
    train.layers_per_stage(2, 3)


class _FakeEpl(types.ModuleType):
  """Records the EPL calls train.build_graph makes."""

  class GraphKeys(object):
    GLOBAL_MEAN_OBJECTS = "global_mean_objects"

  def __init__(self):
    super(_FakeEpl, self).__init__("epl")
    self.calls = []
    self.entered = []

  def Config(self, d):  # pylint: disable=invalid-name
    self.calls.append(("Config", dict(d)))
    return d

  def init(self, config):
    self.calls.append(("init", config))

  def replicate(self, device_count=1, name=None):
    fake = self

    @contextlib.contextmanager
    def scope():
      fake.entered.append(name)
      yield
    self.calls.append(("replicate", device_count, name))
    return scope()

  def set_default_strategy(self, strategy):
    self.calls.append(("set_default_strategy",))

  def add_to_collection(self, tensor, key):
    self.calls.append(("add_to_collection", tensor.op.name, key))


def test_epl_annotations_with_stand_in(monkeypatch):
  fake = _FakeEpl()
  monkeypatch.setitem(sys.modules, "epl", fake)
  flags = train.make_flags(config="tiny", num_layers=4, parallel="pipeline_data",
                           num_stages=2, num_micro_batch=4, num_cpu_devices=8,
                           schedule="PreferForward")
  with tf.Graph().as_default():
    h = train.build_graph(flags)
  assert fake.calls[0] == ("Config", {"pipeline.num_micro_batch": 4,
                                      "pipeline.strategy": "PreferForward",
                                      "pipeline.num_stages": 2,
                                      "cluster.num_cpu_devices": 8})
  assert fake.calls[1][0] == "init"
  # input, embeddings, 4 layers, heads
  assert fake.entered == ["stage_0", "stage_0", "stage_0", "stage_0",
                          "stage_1", "stage_1", "stage_1"]
  assert ("add_to_collection", "total_loss", "global_mean_objects") in fake.calls
  assert h["num_replicas"] == 4
  assert h["global_batch_size"] == 8 * 4 * 4

  fake = _FakeEpl()
  monkeypatch.setitem(sys.modules, "epl", fake)
  with tf.Graph().as_default():
    h = train.build_graph(train.make_flags(parallel="data", num_cpu_devices=2))
  assert ("set_default_strategy",) in fake.calls and not fake.entered
  assert h["global_batch_size"] == 16


# --------------------------------------------------------------------------
# input pipelines


@pytest.mark.parametrize("parallel, num_stages, virtual_stages, replicas", [
    ("pipeline_data", 4, 0, 2), ("pipeline_data", 4, 2, 4),
    ("auto", 2, 2, 4), ("data", 0, 2, 8)])
def test_replicas_count_devices_per_replica(parallel, num_stages,
                                            virtual_stages, replicas):
  """Interleaved 1F1B puts two stage scopes on a device; auto parallel
  cuts num_stages x virtual_stages stages onto num_stages devices."""
  f = train.resolve_flags(dict(parallel=parallel, num_stages=num_stages,
                               virtual_stages=virtual_stages))
  assert train.num_replicas(f, total_devices=8) == replicas


def test_synthetic_input_shapes_and_determinism():
  b, s, p, vocab = 4, 32, 5, 100
  with tf.Graph().as_default():
    nxt1 = input_pipeline.get_next(input_pipeline.synthetic_dataset(
        b, s, p, vocab_size=vocab, seed=7))
    nxt2 = input_pipeline.get_next(input_pipeline.synthetic_dataset(
        b, s, p, vocab_size=vocab, seed=7))
    expected = {"input_ids": [b, s], "input_mask": [b, s],
                "segment_ids": [b, s], "masked_lm_positions": [b, p],
                "masked_lm_ids": [b, p], "masked_lm_weights": [b, p],
                "next_sentence_labels": [b]}
    assert set(nxt1) == set(input_pipeline.FEATURE_NAMES)
    for name, shape in expected.items():
      assert nxt1[name].shape.as_list() == shape, name
      want = tf.float32 if name == "masked_lm_weights" else tf.int32
      assert nxt1[name].dtype == want, name
    with tf.Session() as sess:
      a1, a2 = sess.run(nxt1), sess.run(nxt1)
      c1 = sess.run(nxt2)
  for name in expected:
    np.testing.assert_array_equal(a1[name], c1[name])
  assert not np.array_equal(a1["input_ids"], a2["input_ids"])
  for batch in (a1, a2):
    ids, mask, w = batch["input_ids"], batch["input_mask"], batch[
        "masked_lm_weights"]
    assert ids.min() >= 0 and ids.max() < vocab
    assert (ids[:, 0] == input_pipeline.CLS_ID).all()
    assert (ids[mask == 0] == input_pipeline.PAD_ID).all()
    assert (w.sum(axis=1) >= 1).all()
    pos = batch["masked_lm_positions"]
    for row in range(b):
      chosen = pos[row][w[row] > 0]
      assert len(set(chosen)) == len(chosen)
      assert (mask[row][chosen] == 1).all() and (chosen > 0).all()
    assert set(np.unique(batch["next_sentence_labels"])) <= {0, 1}


def test_synthetic_examples_do_not_depend_on_the_batch_size():
  # Two batches of 4 are one batch of 8: N replicas (or micro-batches) of
  # batch B see the examples a single device sees with batch N x B.
  with tf.Graph().as_default():
    small = input_pipeline.get_next(input_pipeline.synthetic_dataset(
        4, 16, 3, vocab_size=50, seed=2))
    large = input_pipeline.get_next(input_pipeline.synthetic_dataset(
        8, 16, 3, vocab_size=50, seed=2))
    with tf.Session() as sess:
      first, second, both = sess.run(small), sess.run(small), sess.run(large)
  for name in input_pipeline.FEATURE_NAMES:
    np.testing.assert_array_equal(
        np.concatenate([first[name], second[name]]), both[name], name)


def test_synthetic_shards_take_alternate_chunks():
  chunk = input_pipeline.SYNTHETIC_CHUNK
  with tf.Graph().as_default():
    whole = input_pipeline.get_next(input_pipeline.synthetic_dataset(
        2 * chunk, 16, 3, vocab_size=50, seed=2))
    shards = [input_pipeline.get_next(input_pipeline.synthetic_dataset(
        chunk, 16, 3, vocab_size=50, seed=2, num_shards=2, shard_index=i))
              for i in range(2)]
    with tf.Session() as sess:
      whole, shards = sess.run([whole, shards])
  for name in input_pipeline.FEATURE_NAMES:
    np.testing.assert_array_equal(
        np.concatenate([shards[0][name], shards[1][name]]), whole[name])
  with pytest.raises(ValueError):
    input_pipeline.pretraining_dataset("", 4, 16, 3, num_shards=2,
                                       shard_index=2)


# --------------------------------------------------------------------------
# tokenizer and TFRecords


def test_wordpiece_tokenizer(tmp_path):
  vocab_file = str(tmp_path / "vocab.txt")
  tokens = cpd.write_toy_vocab(vocab_file, words=["un", "##aff", "##able",
                                                  "play", "##ing"])
  assert tokens[:5] == list(cpd.SPECIAL_TOKENS)
  tok = cpd.FullTokenizer(vocab_file, do_lower_case=True)
  assert tok.tokenize(u"Unaffable, PLAYING!") == [
      "un", "##aff", "##able", ",", "play", "##ing", "!"]
  assert cpd.BasicTokenizer().tokenize(u"H\u00e9llo  [MASK] wo-rld") == [
      "hello", "[MASK]", "wo", "-", "rld"]
  assert tok.wordpiece.tokenize_word(u"\u4e2d") == ["[UNK]"]


_TEXT = u"""The cat sat on the mat.
It was a sunny day, and the cat was happy.
Then the dog ran home.
The dog was tired after running.

A second document starts here.
It talks about trains and tracks.
Trains run on tracks every day.

Third document: short.
Really short indeed, but it has two lines.
"""


def test_tfrecord_round_trip_and_training(tmp_path):
  text_file = tmp_path / "corpus.txt"
  text_file.write_text(_TEXT)
  vocab_file = str(tmp_path / "vocab.txt")
  vocab = cpd.write_toy_vocab(vocab_file)
  outputs = [str(tmp_path / "data-0.tfrecord"), str(tmp_path /
                                                    "data-1.tfrecord")]
  seq, preds = 32, 5
  n = cpd.main(["--input_file", str(text_file), "--output_file",
                ",".join(outputs), "--vocab_file", vocab_file,
                "--max_seq_length", str(seq), "--max_predictions_per_seq",
                str(preds), "--dupe_factor", "3", "--random_seed", "1"])
  assert n == 0
  assert all(os.path.getsize(p) > 0 for p in outputs)

  with tf.Graph().as_default():
    ds = input_pipeline.tfrecord_dataset(str(tmp_path / "data-*.tfrecord"),
                                         batch_size=4, seq_length=seq,
                                         max_predictions_per_seq=preds)
    nxt = input_pipeline.get_next(ds)
    assert nxt["input_ids"].shape.as_list() == [4, seq]
    assert nxt["next_sentence_labels"].shape.as_list() == [4]
    assert nxt["masked_lm_weights"].dtype == tf.float32
    assert nxt["input_ids"].dtype == tf.int32
    with tf.Session() as sess:
      batches = [sess.run(nxt) for _ in range(3)]
  # Two shards of two files: shard 1 reads the second file only.
  def records(files, **shard):
    with tf.Graph().as_default():
      nxt = input_pipeline.get_next(input_pipeline.tfrecord_dataset(
          files, batch_size=1, seq_length=seq, max_predictions_per_seq=preds,
          is_training=False, **shard))
      out = []
      with tf.Session() as sess:
        try:
          while True:
            out.append(sess.run(nxt)["input_ids"])
        except tf.errors.OutOfRangeError:
          return np.concatenate(out)
  np.testing.assert_array_equal(
      records(",".join(outputs), num_shards=2, shard_index=1),
      records(outputs[1]))
  cls_id, sep_id = vocab.index("[CLS]"), vocab.index("[SEP]")
  for batch in batches:
    ids, mask, segs = (batch["input_ids"], batch["input_mask"],
                       batch["segment_ids"])
    assert (ids[:, 0] == cls_id).all()
    assert ids.max() < len(vocab)
    for row in range(4):
      length = int(mask[row].sum())
      assert (mask[row][:length] == 1).all() and (ids[row][length:] == 0).all()
      assert ids[row][length - 1] == sep_id
      assert np.sum(ids[row] == sep_id) == 2
      assert segs[row][length - 1] == 1 and segs[row][0] == 0
      w = batch["masked_lm_weights"][row]
      assert 1 <= w.sum() <= preds
      pos = batch["masked_lm_positions"][row][w > 0]
      assert (pos > 0).all() and (pos < length - 1).all()

  model_dir = str(tmp_path / "model")
  result = train.run(train.make_flags(
      config="tiny", steps=2, batch_size=4, seq_length=seq,
      max_predictions_per_seq=preds, input_files=str(tmp_path / "data-*"),
      log_every=1, model_dir=model_dir, warmup_steps=1))
  assert result["steps"] == 2 and np.isfinite(result["losses"]).all()
  assert tf.train.latest_checkpoint(model_dir).endswith("-2")
  assert glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))


# --------------------------------------------------------------------------
# optimizer


def test_adamw_dense_sparse_and_reference():
  rng = np.random.RandomState(0)
  init = rng.randn(6, 3).astype(np.float32)
  bias0 = rng.randn(3).astype(np.float32)
  idx = np.array([0, 2, 2, 5])
  upd = rng.randn(4, 3).astype(np.float32)
  lr, wd, b1, b2, eps = 0.1, 0.5, 0.9, 0.999, 1e-6

  def build(sparse):
    w = tf.get_variable("w", initializer=init)
    bias = tf.get_variable("layer/bias", initializer=bias0)
    if sparse:
      g = tf.IndexedSlices(tf.constant(upd), tf.constant(idx), tf.constant(
          [6, 3]))
    else:
      g = tf.math.unsorted_segment_sum(tf.constant(upd), tf.constant(idx), 6)
    opt = optimization.AdamWeightDecayOptimizer(lr, weight_decay_rate=wd)
    step = tf.train.get_or_create_global_step()
    return w, bias, step, opt.apply_gradients(
        [(g, w), (tf.ones([3]), bias)], global_step=step)

  results = []
  for sparse in (False, True):
    with tf.Graph().as_default():
      w, bias, step, op = build(sparse)
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(2):
          sess.run(op)
        results.append(sess.run([w, bias, step]))
  (w_dense, b_dense, s_dense), (w_sparse, b_sparse, _) = results
  assert s_dense == 2
  tolerance.assert_equivalent(w_dense, w_sparse)
  tolerance.assert_equivalent(b_dense, b_sparse)

  g = np.zeros_like(init)
  np.add.at(g, idx, upd)
  w_ref, m, v = init.copy(), np.zeros_like(init), np.zeros_like(init)
  b_ref, mb, vb = bias0.copy(), np.zeros(3), np.zeros(3)
  for _ in range(2):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    w_ref = w_ref - lr * (m / (np.sqrt(v) + eps) + wd * w_ref)
    mb = b1 * mb + (1 - b1)
    vb = b2 * vb + (1 - b2)
    b_ref = b_ref - lr * (mb / (np.sqrt(vb) + eps))  # no decay on bias
  np.testing.assert_allclose(w_dense, w_ref, rtol=1e-4, atol=1e-5)
  tolerance.assert_equivalent(b_dense, b_ref)


def test_learning_rate_schedule():
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    lr = optimization.learning_rate_schedule(step, 1.0, num_train_steps=10,
                                             num_warmup_steps=4)
    with tf.Session() as sess:
      values = [sess.run(lr, {step: s}) for s in range(11)]
  np.testing.assert_allclose(values[:4], [0.25, 0.5, 0.75, 1.0])
  tolerance.assert_equivalent(values[4:], [1.0, 5 / 6., 4 / 6., 3 / 6., 2 / 6.,
                                          1 / 6., 0.0])


# --------------------------------------------------------------------------
# training


def test_tiny_training_loss_falls_without_epl(monkeypatch):
  # sys.modules["epl"] = None makes any "import epl" fail.
  monkeypatch.setitem(sys.modules, "epl", None)
  result = train.run(train.make_flags(
      config="tiny", steps=30, batch_size=16, learning_rate=1e-3,
      warmup_steps=3, dropout=False, log_every=10, seed=3))
  losses = result["losses"]
  assert len(losses) == 30 and np.isfinite(losses).all()
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3, losses
  assert result["examples_per_sec"] > 0
  assert result["global_batch_size"] == 16
