# The GPU worker image: CUDA torch, diffusers, the Celery worker.
FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
RUN pip install --no-cache-dir "torch>=2.4,<2.15" --index-url https://download.pytorch.org/whl/cu124
COPY pyproject.toml README.md ./
COPY batching ./batching
COPY storage ./storage
COPY worker ./worker
COPY api ./api
COPY stepwise_cli ./stepwise_cli
COPY benchmarks ./benchmarks
RUN pip install --no-cache-dir ".[engine]"
CMD ["stepwise", "worker"]
