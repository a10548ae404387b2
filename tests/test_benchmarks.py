"""Every benchmark still runs: each at its `--smoke` size completes and
prints its table with finite figures (the figures' values are not
checked: no timed tests). One subprocess runs them all in turn
(`python -m benchmarks.all --smoke --in_process`, TensorFlow imported
once) and writes the page `make benchmarks` writes, which is checked
too. A benchmark that needs Horovod skips where Horovod is not installed
(TensorFlow past 2.15), saying why. On the newer TensorFlow (`make
test-latest`) only the benchmarks documented on both versions run
(data parallel and start-up): the others measure nothing version-specific
and already ran under `make test`, and the CI budget is shared."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import all as all_benchmarks  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import machine  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import verdict  # noqa: E402  pylint: disable=wrong-import-position
from tests import tf_versions  # noqa: E402  pylint: disable=wrong-import-position

# The sections this TensorFlow runs.
SECTIONS = [s for s in all_benchmarks.SECTIONS
            if s.both_versions or tf_versions.TF <= tf_versions.PRIMARY_TF]

_NOT_FINITE = re.compile(r"(?<![\w.])[-+]?(nan|inf)(?![\w])", re.I)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """(results by benchmark name, the page) of one smoke run of all."""
  folder = tmp_path_factory.mktemp("benchmarks")
  page, results = folder / "benchmarks.md", folder / "results.json"
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.all", "--smoke", "--in_process",
       "--only", ",".join(s.name for s in SECTIONS),
       "--out", str(page), "--json", str(results)],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT,
                         TF_CPP_MIN_LOG_LEVEL="2"),
      capture_output=True, text=True, timeout=1800, check=False)
  assert results.exists(), done.stdout[-3000:] + done.stderr[-3000:]
  with open(results) as f:
    by_name = {r["name"]: r for r in json.load(f)}
  return by_name, page.read_text()


@pytest.mark.parametrize("section", all_benchmarks.SECTIONS,
                         ids=lambda s: s.name)
def test_benchmark_runs_at_smoke_size(smoke, section):
  if section not in SECTIONS:
    pytest.skip(tf_versions.skip_reason(
        "only the benchmarks documented on both TensorFlow versions run "
        "here; %s runs under make test" % section.name))
  result = smoke[0][section.name]
  if result["status"] == "skipped":
    pytest.skip(result["output"])
  output = result["output"]
  assert result["status"] == "ok", output[-4000:]
  assert section.marker in output, (
      "%s printed no table (no %r):\n%s" % (section.name, section.marker,
                                            output[-3000:]))
  table = output[output.index(section.marker):]
  written = re.findall(r"^wrote (\S+)$", output, re.M)
  if written:  # a benchmark that draws pictures: they are there
    assert all(os.path.getsize(path) > 0 for path in written), written
  else:
    assert _NUMBER.search(table), table
  assert not _NOT_FINITE.search(output), output[-3000:]


def test_page_says_when_where_and_how(smoke):
  page = smoke[1]
  assert "SMOKE SIZE" in page
  assert re.search(r"- date: \d{4}-\d\d-\d\d \d\d:\d\d", page)
  assert re.search(r"- machine: \d+ CPU cores, [\d.]+ GiB memory, .*"
                   r"TensorFlow \d+\.\d+", page)
  for section in SECTIONS:
    assert "## %s" % section.heading in page
    assert "`python benchmarks/%s.py %s`" % (
        section.name, shlex.join(section.smoke_args)) in page


def test_resume_keeps_what_succeeded_and_runs_again_what_failed(
    monkeypatch):
  # No benchmark runs in this process: one would leave its settings (the
  # EPL logger's level) to the tests after it.
  ran = []
  monkeypatch.setattr(all_benchmarks, "_run_here", lambda section, smoke: (
      ran.append(section.name) or ("ok", "ran")))
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  first, second = SECTIONS[0], SECTIONS[1]
  done = [{"name": first.name, "tf": tf.__version__, "status": "ok",
           "seconds": 1.0, "output": "kept", "command": "python x.py"},
          {"name": second.name, "tf": tf.__version__, "status": "failed",
           "seconds": 1.0, "output": "not kept", "command": "python x.py"}]
  saved = []
  results = all_benchmarks.run_sections(
      [first], [sys.executable], smoke=True, in_process=True, timeout=60,
      done=done, save=saved.append)
  assert results == done[:1] and not saved  # nothing ran
  page = all_benchmarks.page([first], results, smoke=True, load=0.5)
  assert "kept" in page and "whole run: 0 minutes" in page
  # Results of benchmarks outside this run are saved with it, not lost.
  results = all_benchmarks.run_sections(
      [second], [sys.executable], smoke=True, in_process=True, timeout=60,
      done=done[:1], save=saved.append)
  assert saved[-1][0] == done[0] and saved[-1][1:] == results
  assert ran == [second.name] and results[0]["output"] == "ran"


def test_data_parallel_times_plain_tf_and_epl_in_turn(smoke):
  # data_parallel's local rows, each in a process of its own, are timed
  # round by round: every row has a ratio to plain TF on one device
  # (examples/s and CPU a step) over the same rounds, the other processes'
  # load, and EPL DP's verdict against issue 35's goals; the row
  # processes' peak memory ends the output.
  output = smoke[0]["data_parallel"]["output"]
  table = output[output.index("Timed in turn"):output.index("One traced")]
  for row in ("TF MirroredStrategy", "EPL DP", "EPL DP, one pool"):
    assert re.search(r"^\S+ +%s +\d+ +\d+\.\d+x .* \d+\.\d+x +\d+\.\d+$"
                     % re.escape(row), table, re.M), table
  assert re.search(r"EPL DP: \d+\.\d+x TF 1 device's examples/s \(goal "
                   r"at least 0\.95x: (meets|misses)\), \d+\.\d+x "
                   r"MirroredStrategy's \(goal at least 1\.00x: "
                   r"(meets|misses)\)", table), table
  assert re.search(r"^resnet/\d+: peak RSS of the row processes \d+\.\d\d GiB "
                   r"together", output, re.M), output[-2000:]


def test_in_turn_rounds_start_one_run_later_each_round():
  from benchmarks import in_turn  # pylint: disable=import-outside-toplevel
  order = []
  runs = [(name, lambda name=name: order.append(name)) for name in "abc"]
  timed, quiet, _ = in_turn.rounds(runs, 3, quiet_cores=2.0 ** 10)
  assert order == list("abc" "bca" "cab")
  assert {name: len(pairs) for name, pairs in timed.items()} == {
      "a": 3, "b": 3, "c": 3}
  assert len(quiet) == 3
  # The median over the rounds of each round's ratio, not a ratio of
  # medians.
  assert in_turn.median_ratio([(2.0, 1.0), (9.0, 3.0), (4.0, 1.0)],
                              [(1.0, 1.0), (3.0, 1.0), (1.0, 1.0)], 0) == 3.0
  assert in_turn.median_ratio([(2.0, 1.0), (9.0, 3.0), (4.0, 1.0)],
                              [(1.0, 1.0), (3.0, 1.0), (1.0, 1.0)], 1) == 1.0


def test_verdict_says_who_wins():
  assert verdict.verdict(1.2) == "EPL wins"
  assert verdict.verdict(0.8) == "EPL loses"
  assert verdict.verdict(1.02) == "level"
  assert verdict.verdict(0.8, higher_is_better=False) == "EPL wins"
  assert verdict.verdict(float("nan")) == "-"
  assert verdict.ratio(3.0, 0) != verdict.ratio(3.0, 0)  # nan, no error


def test_mfu_uses_the_peak_of_the_gpu_or_the_flag():
  assert machine.peak_flops("NVIDIA H100 80GB HBM3") == 494.7e12
  assert machine.peak_flops("NVIDIA H100 PCIe") == 378.0e12
  assert machine.peak_flops("NVIDIA A100-SXM4-40GB") == 156.0e12
  assert machine.peak_flops("") is None
  assert machine.peak_flops("", override_tflops=2.0) == 2e12
  # 1e12 FLOPs per 0.5 s step on 2 devices of 1e12 FLOP/s: 100%.
  assert machine.mfu(1e12, 0.5, 1e12, 2) == pytest.approx(1.0)
  assert machine.mfu(1e12, 0.5, None, 2) is None


def test_gpu_check_runs_at_smoke_size():
  # benchmarks/gpu_check.sh with EPL_GPU_CHECK_SMOKE=1: tiny BERT on CPU,
  # every row (plain TF, EPL AMP, EPL AMP + GC) trains and is reported
  # against NVIDIA's anchor.
  done = subprocess.run(
      ["sh", "benchmarks/gpu_check.sh", "--steps", "1"], cwd=ROOT,
      env=dict(os.environ, EPL_GPU_CHECK_SMOKE="1", PYTHON=sys.executable,
               PYTHONPATH=ROOT),
      capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  for row in ("TF ", "EPL AMP ", "EPL AMP + GC "):
    assert re.search(r"^%s +\d+\.\d" % re.escape(row), done.stdout, re.M), (
        done.stdout)
  assert "485.6 sequences/s" in done.stdout
  assert not _NOT_FINITE.search(done.stdout), done.stdout


def test_half_precision_mfu_peaks():
  assert machine.half_peak_flops("NVIDIA A100-SXM4-80GB") == 312.0e12
  assert machine.half_peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
  assert machine.half_peak_flops("") is None
