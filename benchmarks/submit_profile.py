"""Where a submit's API CPU goes: the Flask app in this process (its test client, no HTTP server), a
redis-server of its own, cProfile over the requests.

    python -m benchmarks.submit_profile [--batch 0|N] [--requests 2000] [--sort cumulative|tottime] [--top 40]

Prints the API CPU per request (process time, so waits on Redis are not counted; the test client's
own request building is) and the profile. `stepwise bench --submit` measures rates over HTTP; this
says what to make cheaper.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

from benchmarks.api_submit import BODY
from benchmarks.local_services import redis_server

KEY = "sk_profile"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=0, help="0: POST /v1/jobs; N: POST /v1/jobs/batch of N jobs")
    parser.add_argument("--requests", type=int, default=2000, help="timed requests (as many again are profiled)")
    parser.add_argument("--sort", default="cumulative", help="pstats sort key")
    parser.add_argument("--top", type=int, default=40, help="profile lines to print")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepwise-profile-", ignore_cleanup_errors=True) as folder:
        profile_submits(args, Path(folder))


def profile_submits(args: argparse.Namespace, folder: Path) -> None:
    with redis_server(folder) as url:
        os.environ.update(
            STEPWISE_API_KEYS=f"profile:{KEY}",
            STEPWISE_REDIS_URL=url,
            STEPWISE_STORAGE_URL=(folder / "images").as_uri(),
            STEPWISE_VAR_DIR=str(folder / "var"),
            STEPWISE_ACCEPT_UNSERVED_MODELS="true",
            STEPWISE_MAX_QUEUE_DEPTH=str(10**9),
        )
        from api import create_app

        client = create_app().test_client()
        headers = {"Authorization": f"Bearer {KEY}"}
        path, body = ("/v1/jobs/batch", {"jobs": [BODY] * args.batch}) if args.batch else ("/v1/jobs", BODY)
        expected = 200 if args.batch else 202

        def submit() -> None:
            response = client.post(path, json=body, headers=headers)
            assert response.status_code == expected, response.get_data(as_text=True)

        for _ in range(min(50, args.requests)):
            submit()
        started = time.process_time()
        for _ in range(args.requests):
            submit()
        per_request = (time.process_time() - started) / args.requests
        jobs = args.batch or 1
        print(
            f"{path}: {1000 * per_request:.3f} ms of CPU per request ({1e6 * per_request / jobs:.0f} us per job), "
            f"{args.requests} requests"
        )
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.requests):
            submit()
        profile.disable()
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
