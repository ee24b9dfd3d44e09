"""The report's "What fills memory" subsection, its two charts and the summary's memory lines, from the recorded
leaking run and from hand-made memory sections (a leak, fixes, a run that died of a failed allocation, none)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from report_records import HOSTILE, full_memory, gpu_record, hostile_record, leak_record

from conftest import make_record
from gpuscope.record import CollectorStatus, KeptTensors, Memory, MemoryGrowth, OutOfMemory
from gpuscope.report import render_report
from gpuscope.report.charts import build_charts, memory_peak, memory_timeline
from gpuscope.report.summary import summary_lines

SCRIPT_TAGS = 3
"""The page's own <script> elements: plotly.js, the charts' JSON, and the code that draws them."""


def memory_text(record) -> str:
    """The words of the "What fills memory" subsection, tags dropped and spaces squeezed."""
    html = render_report(record, inline_plotly=False)
    part = html.split("<h3>What fills memory</h3>", 1)[1].split("<h3>Host memory", 1)[0]
    return re.sub(r" ([.,:;])", r"\1", re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", part))).strip()


def charts_of(record) -> dict:
    html = render_report(record, inline_plotly=False)
    return json.loads(html.split('id="gpuscope-charts">', 1)[1].split("</script>", 1)[0])


def memory_summary(record) -> list[str]:
    return [line for line in summary_lines(record, Path("run")) if "memory" in line and "run record" not in line]


def oom_only() -> Memory:
    """A run that died of a failed allocation in its first step: no measured step, only the census."""
    return Memory(out_of_memory=OutOfMemory(
        error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", device="cuda",
        requested_bytes=20 * 2**30, step=0, parameters_bytes=6 * 2**30, gradients_bytes=0,
        optimizer_state_bytes=0, activations_bytes=50 * 2**30, other_bytes=2**30))


def test_the_recorded_leaking_run_shows_its_peak_holders_kept_tensors_growth_and_fixes() -> None:
    record = leak_record()
    text = memory_text(record)
    assert text.startswith("At the peak of steps 11-12, 29 MiB of tensors were live on the CPU, in the optimizer "
                           "step; the largest part is optimizer state, 8 MiB (28%). Headroom: 23.0 GiB under the "
                           "host&#39;s memory (23.5 GiB)."), text
    assert "optimizer state 8 MiB 28% activations 4 MiB 14% inputs 514 KiB 2%" in text
    assert "Activations at their highest (6 MiB, at the end of forward)" in text
    assert "Linear_0 leak_feats.py:9 in forward 1 2 MiB" in text
    assert "outside any module leak_feats.py:19 in &lt;module&gt;" in text
    assert "Step 11 made 2 MiB still alive at the end of step 12" in text
    assert "leak_feats.py:9 in forward leak_feats.py:17 in &lt;module&gt; 2 MiB activations" in text
    assert "Resident memory grows 2 MiB a step over steps 15-80 (149 MiB in all): a leak." in text
    assert ("an optimizer whose state is half as large (SGD with momentum, Adafactor) 4 MiB 14% the optimizer&#39;s "
            "state (8.6 MB) halved") in text
    assert "ran out of memory" not in text and "Short of memory" not in text


def test_the_peak_bar_adds_up_to_the_peak_and_the_timeline_stacks_each_category() -> None:
    record = leak_record()
    memory = record.memory
    peak = memory_peak(record)
    assert [t["name"] for t in peak["data"]] == ["parameters", "gradients", "optimizer state", "inputs",
                                                 "activations", "temporaries", "unknown"]
    assert sum(t["x"][0] for t in peak["data"]) == pytest.approx(memory.peak_bytes / 2**20, rel=1e-3)
    assert peak["layout"]["xaxis"]["title"]["text"] == "memory at the peak (MiB)"
    timeline = memory_timeline(record)
    assert all(t["stackgroup"] == "memory" for t in timeline["data"])
    assert len(timeline["data"][0]["x"]) == len(memory.timeline.t_ms)
    assert {"memory-peak", "memory-timeline"} <= set(charts_of(record))
    big = charts_of(gpu_record())
    assert big["memory-peak"]["layout"]["xaxis"]["title"]["text"] == "memory at the peak (GiB)"
    assert "temporaries" not in [t["name"] for t in big["memory-timeline"]["data"]]  # all zero: not drawn


def test_a_leak_shows_its_growth_and_the_line_that_makes_it() -> None:
    text = memory_text(gpu_record())
    assert "CUDA allocated memory grows 100 MiB a step over steps 10-60 (4.9 GiB in all): a leak." in text
    assert ("a leak. The leak itself is the 100 MiB of tensors a step keeps (below); the rest is the allocator's "
            "slack, which varies run by run. Step 20 made 100 MiB still alive at the end of step 21" in text)
    assert ("train.py:77 in main train.py:120 in &lt;module&gt; the list `history` (12 items) 100 MiB activations"
            in text)
    below = dataclasses.replace(full_memory(), growth=MemoryGrowth(source="host", per_step_bytes=2**20, from_step=5,
                                                                   to_step=9, grew_bytes=4 * 2**20))
    text = memory_text(make_record(memory=below))
    assert "Resident memory grows 1 MiB a step over steps 5-9 (4 MiB in all): below the threshold of a leak." in text


def test_fixes_headroom_and_the_repeated_block_are_shown() -> None:
    text = memory_text(gpu_record())
    assert "in the backward pass; the largest part is optimizer state, 12.0 GiB (30%)." in text
    assert ("Headroom: 36.0 GiB under the GPU&#39;s memory (80.0 GiB); the largest batch that fits is about 64 "
            "(this run's: 32).") in text
    assert "Repeated block: Block, 6 instances holding 12.0 GiB of activations" in text
    assert "Checkpoint each Block 10.0 GiB 25% 6 blocks hold 12 GiB" in text
    assert "Keep Adam&#39;s state in bfloat16 6.0 GiB 15%" in text
    assert "The caching allocator reserved 44.0 GiB" in text


def test_a_peak_over_the_limit_is_short_of_memory() -> None:
    memory = dataclasses.replace(full_memory(), headroom_bytes=-3 * 2**30)
    text = memory_text(make_record(memory=memory))
    assert "Short of memory: 3.0 GiB over the GPU&#39;s memory (80.0 GiB)." in text
    assert "Headroom" not in text


def test_a_peak_near_the_limit_is_short_of_memory_where_the_rule_says_so() -> None:
    from gpuscope.record import RuleCheck

    memory = dataclasses.replace(full_memory(), headroom_bytes=2 * 2**30)
    record = dataclasses.replace(make_record(memory=memory), checks={"reduce-memory": RuleCheck("fired")})
    assert "Short of memory: 2.0 GiB left under the GPU&#39;s memory (80.0 GiB)." in memory_text(record)


def test_a_run_that_died_of_a_failed_allocation_shows_what_was_live() -> None:
    record = make_record(memory=oom_only(), device="cuda")
    html = render_report(record, inline_plotly=False)
    assert 'class="callout warn oom"' in html
    text = memory_text(record)
    assert text.startswith("The run ran out of memory at step 0 on the GPU: torch.OutOfMemoryError: CUDA out of "
                           "memory. Tried to allocate 20.00 GiB, asking for 20.0 GiB."), text
    assert "parameters 6.0 GiB 11% activations 50.0 GiB 88% other tensors 1.0 GiB 2% in all 57.0 GiB" in text
    assert "gradients" not in text and "No step was measured" not in text
    assert not {"memory-peak", "memory-timeline"} & set(charts_of(record))
    uncounted = make_record(memory=Memory(out_of_memory=OutOfMemory(error="MemoryError", step=4)))
    assert "The live tensors could not be counted." in memory_text(uncounted)


def test_a_run_without_a_memory_window_says_why() -> None:
    record = make_record(collectors={"memory-window": CollectorStatus(
        "unavailable", "the run ended before the memory window (steps 30-31)")})
    text = memory_text(record)
    assert text.startswith("What fills memory: not recorded in this run.")
    assert "the run ended before the memory window (steps 30-31)" in text
    assert memory_peak(record) is None and memory_timeline(record) is None
    assert not {"memory-peak", "memory-timeline"} & set(build_charts(record))
    assert memory_summary(record) == []


def test_user_strings_in_the_memory_section_are_escaped() -> None:
    record = hostile_record()
    html = render_report(record, inline_plotly=False)
    assert html.count("<script") == SCRIPT_TAGS
    section = html.split('id="memory"', 1)[1].split("</section>", 1)[0]
    assert "<script>" not in section
    assert f"{HOSTILE.replace('<', '&lt;').replace('>', '&gt;')}.py:1 in" in section
    assert section.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 6  # holder, kept, block, fix, error
    line = dataclasses.replace(full_memory(), kept=(KeptTensors(f"a.py:3 in {HOSTILE}", (), 8, 1, "inputs"),))
    assert HOSTILE not in render_report(make_record(memory=line), inline_plotly=False)


def test_the_summary_says_what_fills_memory_at_the_peak_and_names_the_leak() -> None:
    memory = leak_record().memory
    assert memory_summary(leak_record()) == [
        "  memory: peak 30.3 MB at the optimizer (optimizer state 8.6 MB, parameters 4.3 MB, gradients 4.3 MB, "
        "activations 4.2 MB, inputs 526.3 kB, other 8.4 MB)",
        "  memory grows 2.4 MB a step (leak): made at leak_feats.py:9 in forward"]
    not_a_leak = dataclasses.replace(memory, growth=dataclasses.replace(memory.growth, leak=False))
    assert len(memory_summary(make_record(memory=not_a_leak))) == 1
    unplaced = dataclasses.replace(memory, kept=(KeptTensors("", (), 8, 1, "unknown"),))
    assert memory_summary(make_record(memory=unplaced))[1] == "  memory grows 2.4 MB a step (leak)"


def test_the_summary_of_a_run_that_ran_out_of_memory_leads_with_it() -> None:
    lines = summary_lines(make_record(memory=oom_only()), Path("run"))
    assert lines[0] == "gpuscope: the script ran out of memory at step 0; its speed: inconclusive (confidence 0.00)"
    assert not any(line.startswith("  memory") for line in lines)  # no peak was measured: no memory line
    full = memory_summary(gpu_record())
    assert full[0] == ("  memory: peak 42.9 GB in backward (optimizer state 12.9 GB, activations 12.9 GB, "
                       "parameters 6.4 GB, gradients 6.4 GB, temporaries 2.1 GB, inputs 1.1 GB, other 1.1 GB)")
    assert full[1] == ("  memory grows 104.9 MB a step (leak, 104.9 MB of it tensors kept): made at train.py:77 in "
                       "main, kept by the list "
                       "`history` (12 items)")
