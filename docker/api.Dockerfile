# The API image: Flask + gunicorn, no torch. Runs as an unprivileged user.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN useradd --create-home --uid 10001 stepwise
COPY pyproject.toml README.md ./
COPY batching ./batching
COPY storage ./storage
COPY worker ./worker
COPY api ./api
COPY stepwise_cli ./stepwise_cli
COPY benchmarks ./benchmarks
RUN pip install --no-cache-dir .
USER stepwise
EXPOSE 8000
CMD ["stepwise", "api", "--host", "0.0.0.0", "--port", "8000"]
