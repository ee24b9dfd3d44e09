"""``gpuscope`` with some collectors left out: where does the per-step cost go?

    WITHOUT=nvml,nvtx python benchmarks/without_collectors.py run -q --no-probes -o DIR SCRIPT ARGS

``WITHOUT`` names collectors (their ``name``: nvml, nvtx, cuda-memory, memory, practices, syncs, ...) to take out
of the registry before the run, and ``device-timing`` turns off the per-phase CUDA events of the steps collector.
A diagnostic for benchmarks only: the record of such a run lacks what was left out. Used on an H100 to bisect the
per-step cost of the habits sample (README, "On an H100").
"""

import os
import sys

import gpuscope.collect.collectors as collectors
from gpuscope.collect.framework import base

collectors.collector_classes()  # imports every collector module, so all are registered before the filter
names = set(filter(None, os.environ.get("WITHOUT", "").split(",")))
base.REGISTRY[:] = [c for c in base.REGISTRY if c.name not in names]
if "device-timing" in names:
    from gpuscope.collect.steps import device_timeline

    device_timeline.DeviceTimeline.mark = lambda self, step, phase: None  # type: ignore[method-assign]

from gpuscope.cli import main  # noqa: E402

sys.argv = ["gpuscope", *sys.argv[1:]]
sys.exit(main())  # as the console script does: no frame of ours more under the script's
