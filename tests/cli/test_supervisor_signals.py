"""`stepwise up`'s supervisor passes a second Ctrl-C or SIGTERM on to the child it is stopping (a worker then hands
back its jobs at their next step: worker.drain) instead of killing it at once. The worker's side: tests/worker/
test_drain.py; a whole `up` stopped once: tests/cli/test_up_drain.py."""

from __future__ import annotations

import signal
import sys
import threading

from stepwise_cli.supervisor import Supervisor
from tests.support.waiting import wait_for

# A child that, like a draining worker, keeps going after one SIGTERM and exits 0 after the second.
TWO_SIGNALS = """
import signal, sys, time
count = 0
def on_term(signum, frame):
    global count
    count += 1
    print(f"SIGTERM {count}", flush=True)
    if count == 2:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_second_signal_to_up_reaches_the_child_it_is_stopping_which_ends_on_its_own():
    supervisor = Supervisor()
    child = supervisor.start("worker", [sys.executable, "-c", TWO_SIGNALS], {}, stop_timeout=60)
    wait_for(lambda: "ready" in child.last_lines, 30, "the child to start")
    stopping = threading.Thread(target=supervisor.stop_all, daemon=True)
    stopping.start()
    wait_for(lambda: "SIGTERM 1" in child.last_lines, 30, "the child to get the first SIGTERM")

    supervisor.on_signal(signal.SIGTERM, None)  # the first one asked to stop; this is the second
    supervisor.on_signal(signal.SIGTERM, None)
    stopping.join(30)

    assert not stopping.is_alive()
    assert child.process.returncode == 0 and "SIGTERM 2" in child.last_lines  # ended by it, not SIGKILLed
