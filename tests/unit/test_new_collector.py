"""docs/architecture.md's promise: a new collector is one file (plus, where it fills a new field, its record
dataclass in record.py). ``tests/fixtures/collectors/rss_per_step.py`` is such a file: registered, it is among the
collectors a run builds, follows the steps, and fills its record field, with no other file of gpuscope changed."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpuscope.collect.collectors import CollectOptions, collector_classes, default_collectors
from gpuscope.collect.framework.base import REGISTRY
from gpuscope.session import Session

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "collectors" / "rss_per_step.py"


@pytest.fixture
def registered() -> Iterator[type]:
    """The fixture collector's module imported (its ``@register`` runs), and taken out of the registry after."""
    spec = importlib.util.spec_from_file_location("rss_per_step", FIXTURE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    try:
        yield module.RssPerStep
    finally:
        REGISTRY.remove(module.RssPerStep)


def test_a_collector_in_a_file_of_its_own_is_built_run_and_recorded(registered: type, tmp_path: Path) -> None:
    # given: the registry with the fixture collector in it, and the live collectors a run builds, but the host memory
    # sampler, whose field it fills (a new collector would declare a field of its own)
    assert registered in collector_classes()
    options = CollectOptions(cprofile_steps=0, trace_steps=0, probes=False)
    collectors = [c for c in default_collectors(options) if c.stage == "live" and c.name != "memory"]
    assert [type(c) for c in collectors].count(registered) == 1
    # when: a training loop runs under them
    session = Session(tmp_path, ["train.py"], collectors)
    session.start()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(12):
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    session.stop(0)
    # then: run.json holds its status, its note and the field it filled, one reading at each step's beginning
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["collectors"]["rss-per-step"] == {"status": "ok", "reason": None, "field": "host_memory",
                                                   "elapsed_s": None}
    assert "rss-per-step: read at 12 steps" in record["meta"]["notes"]
    memory = record["host_memory"]
    assert len(memory["process_bytes"]) == 12 and memory["peak_process_bytes"] == max(memory["process_bytes"]) > 0
