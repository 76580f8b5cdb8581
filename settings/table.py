"""Every `STEPWISE_*` variable, declared once: its kind (what text it takes), default, meaning and section.

A new variable is one `Variable(...)` here, in its section; then `python -m settings` rewrites
docs/configuration.md and .env.example from this table (tests/test_settings_table.py fails until it has).
Cross-variable checks (the heartbeat below the worker timeout) and structured text (key pairs, JSON)
are the readers' (`storage.settings`, `api.settings`, `worker.settings`), named in the kind's form.
"""

from __future__ import annotations

from settings.declaration import Choice, Flag, Integer, Number, RedisUrl, Text, Url, Variable

SECTIONS = {  # section -> the heading in docs/configuration.md and .env.example
    "shared": "Shared by the API and the workers",
    "api": "API",
    "server": "The HTTP server of `stepwise api`",
    "worker": "Worker",
    "cli": "Command line (`stepwise up`, `submit`, `backfill`, `keys`)",
    "compose": "docker compose only",
    "tests": "Tests",
}

HOSTS = "host names or CIDR ranges, comma-separated"
SECONDS = Number(above=0)
SECONDS_OR_ZERO = Number(minimum=0)
COUNT = Integer(minimum=1)
COUNT_OR_ZERO = Integer(minimum=0)
PORT = Integer(minimum=0, maximum=65535)
DEVICE = Text(form="auto, cpu, cuda or cuda:N", pattern=r"auto|cpu|cuda(:\d+)?")
OVERLAP = Choice(("auto", "on", "off"))
PAIRS = "tenant:{} pairs, comma-separated ({})"

# fmt: off
VARIABLES = (  # the columns line up by section; the formatter would give each argument its own line
    # shared: storage.settings.StorageSettings, and what both processes read of the model and its device
    Variable("STEPWISE_REDIS_URL", RedisUrl(), "redis://127.0.0.1:6379/0",
             "Redis: job records and their queues, and Celery's broker (webhook deliveries, the workers' commands); "
             "`redis://`, `rediss://` (TLS), or the sentinels that find the master, in Celery's form "
             "`sentinel://host:port;sentinel://host:port/DB` (docs/scaling.md)", "shared",
             default_text="the Redis of a `stepwise up` running from this folder (its `var/stepwise.json`), else "
             "`redis://127.0.0.1:6379/0` (`stepwise up`: its own redis-server)", is_secret=True),
    Variable("STEPWISE_REDIS_SENTINEL_MASTER", Text("a name", pattern=r"[^\s;/?#&=]+"), None,
             "the master's name the sentinels know (`sentinel monitor NAME ...`), when STEPWISE_REDIS_URL is a "
             "`sentinel://` URL (docs/scaling.md)", "shared"),
    Variable("STEPWISE_REDIS_REPLICA_WAIT", SECONDS_OR_ZERO, 1.0,
             "while the master has replicas, a write a client is told succeeded (a job created, canceled or "
             "deleted; a key created or revoked) waits up to this long for one replica to confirm it, else the "
             "API answers 503 (docs/guarantees.md); 0: no wait", "shared"),
    Variable("STEPWISE_STORAGE_URL", Url(("file", "s3")), None,
             "where images go: `file:///absolute/path` or `s3://bucket/prefix` (objects "
             "`{prefix}/{job_id}/{index}.png`)", "shared", default_text="`file://<cwd>/var/images`"),
    Variable("STEPWISE_S3_ENDPOINT_URL", Url(("http", "https")), None,
             "S3-compatible endpoint (SeaweedFS, MinIO, R2, ...; path-style addressing); unset: AWS S3. boto3 reads "
             "the credentials (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`)", "shared"),
    Variable("STEPWISE_S3_PUBLIC_URL", Url(("http", "https")), None,
             "the S3 endpoint clients reach, used in presigned image URLs", "shared",
             default_text="`STEPWISE_S3_ENDPOINT_URL`", example="http://localhost:9000"),
    Variable("STEPWISE_PRESIGN_EXPIRY", COUNT, 3600, "lifetime of presigned image URLs, seconds", "shared"),
    Variable("STEPWISE_STORAGE_MAX_ATTEMPTS", COUNT, 5,
             "tries of one image store call on transient errors (exponential backoff)", "shared"),
    Variable("STEPWISE_JOB_TTL", COUNT, 7 * 24 * 3600,
             "how long finished job records are kept, seconds (`DELETE /v1/jobs/{id}` removes one sooner)", "shared"),
    Variable("STEPWISE_IMAGE_TTL", COUNT_OR_ZERO, None,
             "how long generated images are kept, seconds (0: for ever): the workers' sweeper for a local folder, "
             "the bucket's lifecycle rule for S3 (docs/worker.md)", "shared", default_text="`STEPWISE_JOB_TTL`"),
    Variable("STEPWISE_JOB_LEASE_SECONDS", COUNT, 60,
             "a running job's lease, renewed by its worker; a job whose worker stopped renewing it is re-queued",
             "shared"),
    Variable("STEPWISE_HEARTBEAT_INTERVAL", SECONDS, 3.0,
             "seconds between a worker's heartbeats (below `STEPWISE_WORKER_TIMEOUT`)", "shared"),
    Variable("STEPWISE_WORKER_TIMEOUT", SECONDS, 10.0,
             "a worker silent this long is dead: its running jobs are re-queued; a model with no live worker "
             "shows unavailable", "shared"),
    Variable("STEPWISE_MODEL_RETENTION", SECONDS_OR_ZERO, 3600.0,
             "how long a model stays listed, and accepts jobs, after its last heartbeat, seconds", "shared"),
    Variable("STEPWISE_LORA_URL", Url(("file", "s3")), None,
             "the LoRA adapter store: `file:///path` or `s3://bucket/prefix`; unset: adapters refused", "shared"),
    Variable("STEPWISE_LORA_MAX_BYTES", COUNT, 256 * 2**20,
             "the largest adapter file: uploads above it get 413; workers refuse larger files", "shared"),
    Variable("STEPWISE_TENANT_WEIGHTS", Text(PAIRS.format("weight", "weight > 0; storage.fair_share")), "",
             "each tenant's share of its model's queue at one priority (others weigh 1; docs/worker.md, fair share); "
             "give the API and every worker the same value", "shared"),
    Variable("STEPWISE_WEBHOOK_SECRET", Text("`whsec_<base64>` or any string (storage.webhooks)"), None,
             "Standard Webhooks signing secret, read by the worker that delivers events; unset: unsigned. Make one: "
             "python3 -c \"import base64, os; print('whsec_' + base64.b64encode(os.urandom(24)).decode())\"", "shared",
             example="", is_secret=True),
    Variable("STEPWISE_WEBHOOK_ALLOW_HOSTS", Text(HOSTS), "",
             "hosts webhook URLs may reach although not globally routable (e.g. `127.0.0.1,10.0.0.0/8`); checked at "
             "submit and again by the worker before each attempt", "shared", example=""),
    Variable("STEPWISE_PUBLIC_URL", Url(("http", "https")), None,
             "base of `status_url`, `cancel_url` and image routes in job views and webhook payloads, e.g. "
             "`https://images.example.com` behind a proxy", "shared",
             default_text="the request's host (`stepwise up`: its API URL)", example="http://localhost:8000"),
    Variable("STEPWISE_MODEL", Text("a built-in (`builtin:NAME`), a diffusers folder or a cached repo id"),
             "builtin:tiny", "the model a worker serves, and the API's model for jobs that name none: give both the "
             "same value", "shared",
             default_text="`builtin:tiny` (`stepwise up`, `generate`: `builtin:shapes`)", example="builtin:tiny"),
    Variable("STEPWISE_DEVICE", DEVICE, "auto",
             "the workers' device (`auto`: CUDA when available); the API's default cost limits follow it", "shared"),
    # api: api.settings.ApiSettings
    Variable("STEPWISE_API_KEYS", Text(PAIRS.format("key", "api.settings")), None,
             "tenants' API keys; a tenant may hold several (rotation). Keys made by `stepwise keys create --tenant T` "
             "(kept hashed in Redis, effective within a second) work beside them. Make a key: "
             "python3 -c \"import secrets; print('sk_' + secrets.token_urlsafe(24))\"", "api",
             default_text="`stepwise api`: tenant `default`, a key generated on first start into "
             "`$STEPWISE_VAR_DIR/api-key` (mode 0600); `stepwise up`: tenant `local`, key in `var/stepwise.json`",
             example="", is_secret=True),
    Variable("STEPWISE_ADMIN_API_KEYS", Text(PAIRS.format("key", "api.settings")), None,
             "operators' keys: they also read `/metrics` and `/v1/admin/...` (tenants' totals, a model's load for an "
             "autoscaler)", "api",
             default_text="none (`stepwise up`: its generated key)", example="", is_secret=True),
    Variable("STEPWISE_MODELS", Text("models, comma-separated"), "",
             "models the API serves by configuration: their jobs are accepted (and queue) whatever the workers' state; "
             "the default model is one of them when it is set",
             "api", default_text="none (`stepwise up`, compose: their models)"),
    Variable("STEPWISE_ACCEPT_UNSERVED_MODELS", Flag(), False,
             "accept jobs for models no worker served recently (they queue until one starts)", "api"),
    Variable("STEPWISE_MAX_QUEUE_DEPTH", COUNT, 10_000,
             "queued jobs at which submits (and batch items) get 429 with Retry-After", "api"),
    Variable("STEPWISE_TENANT_MAX_QUEUED", COUNT_OR_ZERO, 0,
             "one tenant's queued jobs at most, so one tenant cannot fill the queue for all (429 `tenant_queue_full`); "
             "0: no cap", "api", example="1000"),
    Variable("STEPWISE_TENANT_JOBS_PER_MINUTE", COUNT_OR_ZERO, 0,
             "jobs one tenant may create per wall-clock minute (429 `rate_limited`; an idempotent replay counts "
             "none); 0: no cap", "api"),
    Variable("STEPWISE_TENANT_MAX_PRIORITY", Text(PAIRS.format("priority", "high, normal or low")), "",
             "the highest priority each named tenant may ask for; others: high", "api"),
    Variable("STEPWISE_MAX_BODY_BYTES", COUNT, 1024 * 1024, "larger request bodies get 413", "api"),
    Variable("STEPWISE_MAX_FORM_PARTS", COUNT, 100,
             "parts of a `multipart/form-data` body at most (`POST /v1/uploads`, `POST /v1/images/edits`); more get "
             "413", "api"),
    Variable("STEPWISE_MAX_BATCH_JOBS", COUNT, 100,
             "jobs per `POST /v1/jobs/batch` (also the `maxItems` in the OpenAPI document)", "api"),
    Variable("STEPWISE_MAX_PIXELS", COUNT, None, "pixels of one image at most, for every model", "api",
             default_text="by model and `STEPWISE_DEVICE` (docs/api.md, per-model limits)"),
    Variable("STEPWISE_MAX_PIXEL_STEPS", COUNT, None,
             "`num_images` x height x width x steps of one job at most, for every model", "api",
             default_text="by model and `STEPWISE_DEVICE`"),
    Variable("STEPWISE_MODEL_LIMITS", Text('JSON: {"MODEL": {"max_pixels": N, "max_pixel_steps": N}} (api.limits)'),
             "", "per-model cost limits over the defaults", "api"),
    Variable("STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS", SECONDS, 5.0,
             "one deadline for the name lookups of a request's webhook URLs at submit (a batch's distinct hosts "
             "once each, 8 at a time); a host not resolved by then gets a 422", "api"),
    Variable("STEPWISE_IMAGE_URL_HOSTS", Text(HOSTS), "",
             "hosts `init_image` / `mask_image` URLs may name (e.g. `images.example.com,10.20.0.0/16`; the API fetches "
             "them at submit); a listed name must still resolve to global addresses unless a listed range holds them; "
             "empty: no URL is fetched", "api"),
    Variable("STEPWISE_IMAGE_URL_TIMEOUT_SECONDS", SECONDS, 10.0,
             "one deadline for all of a request's image URLs (a batch's too, fetched 8 at once): name lookups to last "
             "byte, redirects included", "api"),
    Variable("STEPWISE_EVENTS_KEEPALIVE_SECONDS", SECONDS, 15.0,
             "an idle `GET /v1/jobs/{id}/events` stream sends a keep-alive comment this often", "api"),
    Variable("STEPWISE_IMAGES_WAIT_SECONDS", SECONDS, 300.0,
             "how long `POST /v1/images/generations` and `/edits` wait for their job before answering 504 (the "
             "job goes on)", "api"),
    Variable("STEPWISE_METRICS_TENANT_LABELS", Flag(), False,
             "a `/metrics` series per tenant (`stepwise_tenant_jobs{tenant,state}`); off: none names a tenant", "api"),
    # server: stepwise_cli.api_cmd and the processes it starts
    Variable("STEPWISE_API_HOST", Text(), "127.0.0.1", "the default of `stepwise api --host`", "server"),
    Variable("STEPWISE_API_PORT", PORT, 8000,
             "the default of `stepwise api --port` and `stepwise up --port` (`make run PORT=N` passes --port)",
             "server"),
    Variable("STEPWISE_API_THREADS", COUNT, 4,
             "app threads per API process: the default of `stepwise api --threads`", "server"),
    Variable("STEPWISE_API_HEADER_TIMEOUT", SECONDS, 10.0,
             "seconds a request head may take to arrive", "server"),
    Variable("STEPWISE_API_REQUEST_TIMEOUT", SECONDS, 30.0,
             "seconds a request body may take to arrive", "server"),
    Variable("STEPWISE_API_DRAIN_SECONDS", SECONDS, 20.0,
             "after SIGTERM, how long `stepwise api` gives the requests in flight before it exits: event streams "
             "end at once with a `reconnect` event, `Prefer: wait` and OpenAI images waits at once with the job as "
             "it is; below Kubernetes' 30 s terminationGracePeriodSeconds", "server"),
    Variable("STEPWISE_API_MAX_CONNECTIONS", COUNT, 1000,
             "per API process: requests in progress (granian's backpressure); more wait", "server"),
    # worker: worker.settings.WorkerSettings and the engine it builds
    Variable("STEPWISE_MAX_NUM_SEQS", COUNT, 8, "the engine's running capacity in images; 1: no batching", "worker",
             example="8"),
    Variable("STEPWISE_MAX_NUM_TOKENS", COUNT_OR_ZERO, 0,
             "a step's budget in rows x latent tokens (admission by cost, mixed sizes); 0: "
             "`STEPWISE_MAX_NUM_SEQS` images at the model's default size", "worker", example="0"),
    Variable("STEPWISE_POLICY", Choice(("default", "fifo")), "default",
             "admission: `default` (no head-of-line blocking) or `fifo` (the reference)", "worker"),
    Variable("STEPWISE_PREEMPTION", Flag(), True,
             "pause running jobs at a step boundary for jobs that outrank them (priority, or less slack to "
             "`complete_by`); they resume where they stopped (docs/worker.md, preemption)", "worker", example="true"),
    Variable("STEPWISE_DETERMINISTIC", Flag(), False,
             "pad every forward to a fixed size: images bit-identical alone or batched", "worker"),
    Variable("STEPWISE_STEP_CACHE", Text("off, balanced, fast, or a threshold above 0 and at most 1",
                                    r"off|balanced|fast|0*(0?\.\d*[1-9]\d*|1(\.0*)?)"), "off",
             "the step cache of jobs that name no `cache` (docs/api.md, step caching); families without one ignore "
             "it", "worker", example="off"),
    Variable("STEPWISE_DECODE_OVERLAP", OVERLAP, "auto",
             "`on`: VAE decode on a thread beside the denoise loop (on CUDA its own stream); `off`: inline; "
             "`auto`: the device's default, on (docs/benchmarks.md)", "worker", example="auto"),
    Variable("STEPWISE_ENCODE_OVERLAP", OVERLAP, "auto",
             "`on`: new jobs' prompts are encoded beside the loop, so running jobs keep stepping; `off`: "
             "inline; `auto`: the device's default, on for CUDA, off for the CPU (docs/benchmarks.md)", "worker",
             example="auto"),
    Variable("STEPWISE_FORWARD_CURVE", OVERLAP, "auto",
             "`on`: at start the worker times its denoiser against the rows of a forward and admits jobs up to the "
             "knee, where more rows stop raising throughput (never above `STEPWISE_MAX_NUM_TOKENS`); `off`: the "
             "token budget alone; `auto`: on for CUDA, off for the CPU (docs/benchmarks.md)", "worker",
             example="auto"),
    Variable("STEPWISE_DENOISER_COMPILE", Choice(("off", "inductor", "graphs", "aot_eager")), "off",
             "the denoiser compiled per row-count bucket, forwards padded to the buckets: `inductor` "
             "(`torch.compile`), `graphs` (its CUDA graphs: one launch a forward), `aot_eager` (traced, not "
             "compiled: for checks); `off` until a GPU run measures it faster (docs/benchmarks.md)", "worker"),
    Variable("STEPWISE_LORA_MODE", Choice(("rows", "group")), "rows",
             "`rows`: different adapters share a forward; `group`: one adapter per forward", "worker"),
    Variable("STEPWISE_LORA_CACHE_ADAPTERS", COUNT, 16, "adapters a worker keeps loaded (LRU)", "worker"),
    Variable("STEPWISE_LORA_CACHE_BYTES", COUNT, 2 * 2**30, "their summed file sizes at most (LRU)", "worker"),
    Variable("STEPWISE_CACHE_DIR", Text("a folder"), None, "where the built-in models are built and cached",
             "worker", default_text="`~/.cache/stepwise`"),
    Variable("STEPWISE_WORKER_CONCURRENCY", COUNT, None,
             "jobs a worker holds at once: the running batch plus a few waiting in its engine (a webhook-only "
             "worker: deliveries at once)", "worker",
             default_text="max_num_seqs + max(2, max_num_seqs // 2)"),
    Variable("STEPWISE_VISIBILITY_TIMEOUT", COUNT, 7200,
             "seconds before Redis hands a webhook delivery whose worker died to another worker (jobs are not "
             "messages: a dead worker's jobs come back through their leases)", "worker",
             example="7200"),
    Variable("STEPWISE_WORKER_METRICS_PORT", PORT, 9101,
             "the worker's Prometheus port; 0: none. A busy port is logged, not fatal", "worker"),
    Variable("STEPWISE_WORKER_METRICS_HOST", Text(), "127.0.0.1",
             "the address the exporter listens on; it has no authentication, so `0.0.0.0` (compose sets it, "
             "publishing no port) is an explicit choice", "worker"),
    Variable("STEPWISE_WORKER_POLL_INTERVAL", SECONDS, 0.2,
             "seconds between a job thread's checks of its job (cancel flag, progress, previews)", "worker"),
    Variable("STEPWISE_PROGRESS_INTERVAL", SECONDS, 0.5,
             "at most one progress write per job per this many seconds", "worker"),
    Variable("STEPWISE_PREVIEW_EVERY", COUNT_OR_ZERO, 0,
             "a live preview (on the job's event stream) every this many steps for jobs that give no "
             "`preview_every`; 0: none", "worker"),
    Variable("STEPWISE_LEASE_SWEEP_INTERVAL", SECONDS, None, "how often a worker looks for lapsed leases", "worker",
             default_text="`STEPWISE_JOB_LEASE_SECONDS` / 4, at least 1"),
    Variable("STEPWISE_SHUTDOWN_GRACE", SECONDS_OR_ZERO, None,
             "caps `STEPWISE_DRAIN_SECONDS`: after SIGTERM, at most this long before every running job is handed "
             "back (0: all of them at their next step)", "worker", default_text="no cap"),
    Variable("STEPWISE_DRAIN_SECONDS", SECONDS, 25.0,
             "after SIGTERM, how long a worker may take to stop: it takes no new job, lets the running jobs that will "
             "finish in time finish and hands the rest back to the queue at a step boundary. Below the time its "
             "supervisor waits before SIGKILL (Kubernetes' terminationGracePeriodSeconds, 30 s by default; compose's "
             "stop_grace_period)", "worker"),
    Variable("STEPWISE_SPOOL_DIR", Text("a folder"), None,
             "where a worker keeps finished images the image store could not take, until it takes them (the job "
             "stays running meanwhile). A worker that restarts, or another one on the same disk, uploads what a "
             "stopped one left there. It must be this user's and writable by no other user (a worker refuses any "
             "other)", "worker", default_text="`stepwise/spool` in this user's state folder (`$XDG_STATE_HOME`, "
             "else `~/.local/state`)"),
    Variable("STEPWISE_SPOOL_MAX_BYTES", COUNT, 1024**3,
             "how much the spool may hold: once it is full the worker takes no new job (they wait in the queue) "
             "until storage takes the images back", "worker"),
    Variable("STEPWISE_REDIS_RETRY_SECONDS", SECONDS_OR_ZERO, 60.0,
             "how long a job's thread retries its record reads and writes while Redis is unreachable", "worker"),
    Variable("STEPWISE_WEBHOOK_MAX_ATTEMPTS", COUNT, 8, "delivery attempts per webhook event", "worker"),
    Variable("STEPWISE_WEBHOOK_BACKOFF", SECONDS_OR_ZERO, 2.0,
             "seconds before the first retry; doubles per attempt (capped at an hour and at half the visibility "
             "timeout)", "worker"),
    Variable("STEPWISE_WEBHOOK_TIMEOUT", SECONDS, 10.0,
             "seconds per delivery attempt: one deadline for the name lookup, connect, send and the answer's head",
             "worker"),
    # cli: stepwise_cli
    Variable("STEPWISE_VAR_DIR", Text("a folder"), "var",
             "where `stepwise up` keeps Redis data, images, its URL, key and Redis URL; `stepwise api`, its key",
             "cli", default_text="`./var`"),
    Variable("STEPWISE_API_URL", Url(("http", "https")), None, "where `submit`, `status`, `backfill` ... send jobs",
             "cli", default_text="what `stepwise up` saved, else `http://127.0.0.1:8000`"),
    Variable("STEPWISE_API_KEY", Text(), None, "the key they send", "cli", default_text="what `stepwise up` saved",
             is_secret=True),
    # compose: read by docker-compose.yml only
    Variable("STEPWISE_MODELS_DIR", Text("a folder"), "./models",
             "host folder mounted at /models in the workers (real checkpoints, HF cache)", "compose",
             example="./models"),
    Variable("STEPWISE_MODEL_2", Text(), "builtin:small", "the second worker's model (compose serves both)", "compose",
             example="builtin:small"),
    Variable("STEPWISE_WORKER_GPU", Text("a GPU index"), "0", "the first worker's GPU", "compose"),
    Variable("STEPWISE_WORKER_2_GPU", Text("a GPU index"), "0",
             "the second worker's GPU: 0 shares the first GPU (both models must fit in its memory); 1 on a host "
             "with two", "compose", example="0"),
    Variable("STEPWISE_S3_BUCKET", Text(), "stepwise", "the bucket of the compose S3 server (SeaweedFS)", "compose",
             example="stepwise"),
    Variable("STEPWISE_S3_BIND", Text("an address of this host"), "127.0.0.1",
             "where the compose S3 server's port 9000 is published: this host's loopback, for a client on this host "
             "(set `STEPWISE_S3_PUBLIC_URL` to match when you publish it further, e.g. `0.0.0.0`)", "compose"),
    # tests
    Variable("STEPWISE_LOAD_JOBS", COUNT, 2000, "jobs tests/faults/test_load.py submits", "tests"),
)
# fmt: on
