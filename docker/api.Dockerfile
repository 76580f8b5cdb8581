# The API image: the project's wheel, no torch; `stepwise api` serves it with granian. Also the image of the
# webhook worker (it loads no model) and, built with EXTRAS=[flower], of Flower. Runs as an unprivileged user.
# The wheel is built from the whole tree (.dockerignore leaves out what no wheel holds), so the image holds
# exactly what `pip install` of the project installs (tests/test_dockerfiles.py reads this file).
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN useradd --create-home --uid 10001 stepwise
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(echo /wheels/stepwise-*.whl)${EXTRAS}" && rm -rf /wheels
USER stepwise
WORKDIR /home/stepwise
EXPOSE 8000
CMD ["stepwise", "api", "--host", "0.0.0.0", "--port", "8000"]
