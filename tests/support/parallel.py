"""How `make test` shares the suite among pytest-xdist's workers (docs/testing.md).

A unit of work is a test file, so a file's module fixtures (its `stepwise api`, its worker) start once, or an
`xdist_group` where files share a cluster that a session or package fixture starts (the worker tests' S3
cluster, the one `stepwise up` of tests/cli/up/). Each xdist worker is a test process of its own: its own
redis-server, S3 servers, ports and state folder, so units never meet.

Units are handed out in collection order as workers free up, heaviest first (what starts worker processes,
then other service processes, then the rest): the last units to start are short ones, and no worker is left
alone with a long file while the others wait.
"""

from __future__ import annotations

import os

import pytest
from xdist.scheduler import LoadGroupScheduling

from tests.support import tiers

WEIGHTS = {tiers.WORKERS: 3, tiers.E2E: 2, tiers.BROWSER: 2}  # others: 0


def group_of(item: pytest.Item) -> str:
    """The unit `item` goes with: its xdist_group, else its file."""
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0] if marker.args else marker.kwargs["name"]) if marker else item.nodeid.partition("::")[0]


def heaviest_units_first(items: list[pytest.Item]) -> None:
    """In an xdist worker, sort `items` in place: whole units, the heaviest first, each kept in its order (a
    stable sort). A run without xdist keeps the files' order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    weight: dict[str, int] = {}
    for item in items:
        item_weight = max((value for marker, value in WEIGHTS.items() if item.get_closest_marker(marker)), default=0)
        weight[group_of(item)] = max(weight.get(group_of(item), 0), item_weight)
    items.sort(key=lambda item: -weight[group_of(item)])


class FileOrGroupScheduling(LoadGroupScheduling):
    """`--dist loadgroup`, but a test outside any group goes with its file (not alone), and units are handed
    out in collection order (`heaviest_units_first`), not by how many tests each holds."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.rfind("@") > nodeid.rfind("]"):  # `@name` ends a grouped test's id, outside its parameters
            return super()._split_scope(nodeid)
        return nodeid.partition("::")[0]
