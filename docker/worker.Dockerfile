# The GPU worker image: the project's wheel with its engine extra, on torch's CUDA build. Runs as an
# unprivileged user. The wheel is built from the whole tree (.dockerignore leaves out what no wheel holds), so
# the image holds exactly what `pip install` of the project installs (tests/test_dockerfiles.py reads this file).
#
# torch is the version `make run` pins (TORCH_VERSION in the Makefile). PyPI's Linux wheel of torch 2.13.0 is its
# CUDA 13.0 build: the CUDA libraries come with it as pip packages (cuda-toolkit 13.0, nvidia-cudnn-cu13 ...),
# so the base is CUDA 13.0's smallest image, which brings the driver check and no second copy of them. The host
# needs an NVIDIA driver that runs CUDA 13.0. Another CUDA build: set TORCH_INDEX_URL to PyTorch's index of that
# build (one that has this version) and CUDA_IMAGE to the nvidia/cuda base of the same CUDA version.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04

FROM python:3.12-slim AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Ubuntu 24.04's Python, 3.12, in a virtual environment of its own.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv \
    && useradd --create-home --uid 10001 stepwise \
    && mkdir -p /cache/stepwise /spool && chown -R stepwise /cache /spool && chmod 700 /spool
ENV PATH=/opt/venv/bin:$PATH
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" "$(echo /wheels/stepwise-*.whl)[engine]" && rm -rf /wheels
USER stepwise
WORKDIR /home/stepwise
# Built-in models are built here once and kept on the `model-cache` volume (docker-compose.yml); images that
# image storage could not take yet wait in /spool (worker/spool.py), on the `spool` volume.
ENV STEPWISE_CACHE_DIR=/cache/stepwise STEPWISE_SPOOL_DIR=/spool
VOLUME ["/cache", "/spool"]
CMD ["stepwise", "worker"]
