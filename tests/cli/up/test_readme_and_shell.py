"""What a user pastes next to a running `stepwise up`: the README's curl tour and OpenAI script, the banner's
curl hint, and Celery's command line in a new shell."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from PIL import Image

from tests.support.servers import child_env
from tests.support.up_process import (
    readme_block,
)

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("stepwise-up")]  # the folder's one `up`


def test_the_readme_curl_tour_runs_as_written_against_stepwise_up(up, tmp_path):
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    script = readme_block("export API=").replace("http://127.0.0.1:8000", saved["api_url"])
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    saved_as = re.findall(r"-o (\S+\.png)", script)[-1]  # the file the tour tells the user to open
    with Image.open(up.workdir / saved_as) as image:
        assert image.format == "PNG"


def test_the_readme_openai_script_runs_as_written_in_ups_folder_and_saves_the_image(up):
    script = readme_block("openai.OpenAI(", language="python")  # verbatim: it finds the API in var/stepwise.json
    result = subprocess.run(
        [sys.executable, "-"],
        input=script,
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert result.returncode == 0, result.stdout + result.stderr + up.log()
    saved_as = re.search(r'open\("(\S+\.png)", "wb"\)', script).group(1)
    assert result.stdout.strip() == f"saved {saved_as}"
    with Image.open(up.workdir / saved_as) as image:
        assert image.format == "PNG" and image.size == (128, 128)


def test_the_banners_curl_hint_pasted_into_a_shell_queues_a_job(up, tmp_path):
    log = up.log_path.read_text()
    hint = log[log.index("curl -H") : log.index("/v1/jobs", log.index("curl -H")) + len("/v1/jobs")]
    hint = re.sub(r"\n\[up\] ", "\n", hint)  # as the terminal shows it, without the [up] prefix up adds

    result = subprocess.run(["bash", "-c", hint], env=child_env(), capture_output=True, text=True, timeout=30)

    assert result.returncode == 0, result
    job = json.loads(result.stdout)
    assert job["state"] == "queued", result.stdout
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    canceled = requests.post(  # a default-size job: leave the worker to the others (on a quiet machine it may be done)
        f"{saved['api_url']}/v1/jobs/{job['job_id']}/cancel",
        headers={"Authorization": f"Bearer {saved['api_key']}"},
        timeout=10,
    )
    assert canceled.status_code in (200, 202, 409), canceled.text


def test_celery_in_a_new_shell_finds_the_redis_of_the_running_up_and_says_so(up):
    celery = str(Path(sys.executable).with_name("celery"))
    log = up.log_path.read_text()
    hint = re.search(r"^\s+(\S.*celery -A worker inspect engine_stats)$", log, flags=re.M).group(1)
    pasted = subprocess.run(
        ["bash", "-c", hint.replace("celery", celery, 1)],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    ping = subprocess.run(  # from up's folder, nothing exported: the state file of the running up
        [celery, "-A", "worker", "inspect", "ping", "--json", "-t", "10"],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert pasted.returncode == 0 and "num_running" in pasted.stdout, pasted.stdout + pasted.stderr
    assert ping.returncode == 0, ping.stdout + ping.stderr
    replies = json.loads(ping.stdout.strip().splitlines()[-1])
    assert any(node.startswith(f"up{up.process.pid}@") for node in replies), replies  # up's worker, not another's
    assert all(reply == {"ok": "pong"} for reply in replies.values()), replies
    said = (
        f"stepwise: Redis {up.redis_url} ({up.var_dir / 'stepwise.json'}, saved by `stepwise up`, pid {up.process.pid})"
    )
    assert said in ping.stderr
