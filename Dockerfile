# EPL on GPUs, in one of two variants (build argument VARIANT):
#
# - `horovod` (the default): the official TensorFlow 2.15 GPU image,
#   Horovod 0.28.1 built with NCCL (GPU collectives) and Gloo (no MPI), and
#   EPL with epl-launch.
#
#     docker build -t epl:gpu .
#     docker run --gpus all --network host -v /data:/data epl:gpu \
#         epl-launch --num_workers 2 --gpu_per_worker 4 /data/train.sh
#
# - `cuda-wheel`: TensorFlow TF_VERSION from its `tensorflow[and-cuda]`
#   wheel (CUDA, cuDNN and NCCL come as pip packages, so any TensorFlow
#   release works without a matching base image) with tf-keras on Python
#   3.11. This is the image for TensorFlow 2.16 and later, where Horovod
#   does not build: it has no Horovod (communication.backend "collective").
#
#     docker build --build-arg VARIANT=cuda-wheel \
#         --build-arg TF_VERSION=2.21.0 -t epl:gpu-tf2.21 .
#
# docs/multi_worker.md shows a job over two machines.

# The TensorFlow release. The `horovod` variant takes 2.15.x only (its base
# image is TensorFlow 2.15's, and Horovod builds against nothing newer).
ARG TF_VERSION=2.15.0
ARG VARIANT=horovod

FROM tensorflow/tensorflow:2.15.0-gpu AS horovod

# The image's Python (TensorFlow lives there) and the CUDA 12.2 / NCCL
# packages that match the CUDA build of TensorFlow 2.15.
ARG TF_VERSION
ARG PYTHON=python3.11
ARG CUDA_PACKAGE_SUFFIX=12-2
ARG NCCL_VERSION=2.18.5-1+cuda12.2
ARG HOROVOD_VERSION=0.28.1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# TensorFlow TF_VERSION in place of the image's own (2.15.0) when they differ.
# The numpy pin is TensorFlow 2.15's (below 2), as in setup.py's `gpu` extra.
RUN case "${TF_VERSION}" in \
      2.15.*) ;; \
      *) echo "VARIANT=horovod needs TF_VERSION 2.15.x (Horovod does not" \
              "build against TensorFlow ${TF_VERSION}): use" \
              "VARIANT=cuda-wheel" >&2; exit 1 ;; \
    esac \
    && if [ "$("${PYTHON}" -c 'from importlib import metadata; \
                print(metadata.version("tensorflow"))')" != "${TF_VERSION}" ]; \
       then \
         "${PYTHON}" -m pip install --no-cache-dir \
             "tensorflow==${TF_VERSION}" "numpy==1.26.4"; \
       fi

# Build tools and headers for Horovod. The CUDA packages come from NVIDIA's
# apt repository, which the base image already lists; their version is in
# their name (12-2), so they are not pinned a second time.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        cmake g++ make "${PYTHON}-dev" \
        "cuda-nvcc-${CUDA_PACKAGE_SUFFIX}" \
        "cuda-cudart-dev-${CUDA_PACKAGE_SUFFIX}" \
        "libnccl2=${NCCL_VERSION}" "libnccl-dev=${NCCL_VERSION}" \
    && rm -rf /var/lib/apt/lists/*

# Horovod against the image's TensorFlow, with NCCL and Gloo. There is no
# GPU while the image builds: link against the CUDA driver stubs.
ENV HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_WITH_TENSORFLOW=1 \
    HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1
RUN ldconfig /usr/local/cuda/targets/x86_64-linux/lib/stubs \
    && "${PYTHON}" -m pip install --no-cache-dir "horovod==${HOROVOD_VERSION}" \
    && ldconfig \
    && horovodrun --check-build

FROM python:3.11-slim-bookworm AS cuda-wheel

ARG TF_VERSION
ARG PYTHON=python3.11

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tf-keras is released with the same version number as TensorFlow; with
# TF_USE_LEGACY_KERAS=1 `tf.keras` is Keras 2, which `tf.compat.v1.layers`
# needs (from TensorFlow 2.16 on, Keras 3 is the default).
RUN "${PYTHON}" -m pip install --no-cache-dir \
        "tensorflow[and-cuda]==${TF_VERSION}" "tf-keras==${TF_VERSION}"
ENV TF_USE_LEGACY_KERAS=1

FROM ${VARIANT}

ARG PYTHON=python3.11

# EPL itself, without an extra: it keeps the image's TensorFlow.
WORKDIR /opt/epl
COPY setup.py README.md ./
COPY epl ./epl
RUN "${PYTHON}" -m pip install --no-cache-dir /opt/epl \
    && command -v epl-launch

WORKDIR /workspace
CMD ["bash"]
