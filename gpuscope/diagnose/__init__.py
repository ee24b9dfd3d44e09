"""From measurements to conclusions: pure functions of the record."""

from __future__ import annotations

import dataclasses

from gpuscope.diagnose.classify import classify
from gpuscope.record import RunRecord


def analyze(record: RunRecord) -> RunRecord:
    """``record`` with its verdict, recommendations (most valuable first) and rule checks filled in; a CUDA record
    summarised on the host's clock is first moved onto the device's (``clock.on_device_clock``)."""
    from gpuscope.diagnose.clock import on_device_clock
    from gpuscope.diagnose.memory import complete_memory
    from gpuscope.diagnose.ranks import job_verdict
    from gpuscope.diagnose.rules import evaluate
    from gpuscope.diagnose.speed import complete_speed_of_light, what_if

    record = on_device_clock(record)
    record = dataclasses.replace(record, speed_of_light=complete_speed_of_light(record),
                                 memory=complete_memory(record))
    recommendations, checks = evaluate(record)
    verdict = job_verdict(classify(record), record.straggler)  # a job's verdict leads with the rank it waits for
    return dataclasses.replace(record, verdict=verdict, recommendations=recommendations, checks=checks,
                               what_if=what_if(record, verdict))
