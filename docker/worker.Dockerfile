# The GPU worker image: CUDA torch, diffusers, the Celery worker. Runs as an unprivileged user.
FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /opt/venv \
    && useradd --create-home --uid 10001 stepwise \
    && mkdir -p /cache/stepwise && chown -R stepwise /cache
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# The same torch as `make run` (TORCH_VERSION in the Makefile), as a CUDA build; pick the index
# (cu124, cu126, cu128 ...) that has this version for your driver.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
COPY pyproject.toml README.md ./
COPY batching ./batching
COPY storage ./storage
COPY worker ./worker
COPY api ./api
COPY stepwise_cli ./stepwise_cli
COPY benchmarks ./benchmarks
RUN pip install --no-cache-dir ".[engine]"
USER stepwise
# Built-in models are built here once and kept on the `model-cache` volume (docker-compose.yml).
ENV STEPWISE_CACHE_DIR=/cache/stepwise
VOLUME ["/cache"]
CMD ["stepwise", "worker"]
