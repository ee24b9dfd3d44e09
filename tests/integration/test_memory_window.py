"""The memory window's analysis on real torch.profiler memory timelines of small CPU loops: each category at the
peak against sizes known exactly, activations against the saved tensors counted independently, what a step leaves
behind named by the line that made it, the repeated block found."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from conftest import load_run, run_gpuscope

from gpuscope.collect.collectors.memory_window import MARK, UserLines, extract, summarise
from gpuscope.record import RunRecord

WIDTH, BATCH = 256, 64
pytestmark = pytest.mark.slow  # each profiles two steps with stacks and builds torch's memory profile: 3-4 s


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.head = torch.nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def measured(step, steps: int = 2):  # noqa: ANN001
    """``step`` run warm, then ``steps`` times under the memory window's profiler, marked as the collector marks."""
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for index in range(steps):
            with record_function(f"{MARK}{10 + index}"):
                step()
    return summarise(extract(prof, UserLines()), "cpu")


def saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """The activations saved for backward by one forward, each storage once, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    return sum(seen.values())


def test_parameters_gradients_and_adams_state_are_their_known_sizes_at_the_peak() -> None:
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
    opt = torch.optim.Adam(model.parameters())
    size = sum(p.numel() * 4 for p in model.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    memory = measured(step)
    assert memory.steps == (10, 11)
    assert abs(memory.parameters_bytes - size) <= 0.1 * size
    assert abs(memory.optimizer_state_bytes - 2 * size) <= 0.1 * 2 * size
    assert abs(memory.gradients_bytes - size) <= 0.1 * size  # the peak is in the optimizer's step: all are live
    assert abs(memory.gradients_max_bytes - size) <= 0.1 * size
    assert memory.peak_phase == "optimizer"
    parts = (memory.parameters_bytes + memory.gradients_bytes + memory.optimizer_state_bytes
             + memory.activations_bytes + memory.inputs_bytes + memory.temporaries_bytes + memory.unknown_bytes)
    assert parts == memory.peak_bytes
    expected = saved_bytes(model, x)
    assert abs(memory.activations_max_bytes - expected) <= 0.25 * expected


def test_the_repeated_block_is_the_module_class_holding_activations_in_every_instance() -> None:
    torch.manual_seed(0)
    model, x = Net(blocks=4), torch.randn(BATCH, WIDTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    memory = measured(step)
    assert memory.repeated_blocks == "Block"
    assert memory.repeated_block_count == 4
    assert 0 < memory.repeated_block_max_bytes < memory.repeated_block_bytes <= memory.activations_max_bytes
    assert memory.repeated_block_inputs_bytes == 4 * BATCH * WIDTH * 4  # each block's input, float32
    assert memory.holders and memory.holders[0].bytes == max(h.bytes for h in memory.holders)


def test_what_a_step_keeps_is_named_by_the_line_that_made_it_and_the_line_that_called_it() -> None:
    torch.manual_seed(0)
    model, x = Net(blocks=2), torch.randn(BATCH, WIDTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        features = model.blocks[0](x)  # the line that makes what stays
        kept.append(features)
        model.head(model.blocks[1](features)).square().mean().backward()
        opt.step()

    memory = measured(step)
    assert memory.kept, "the appended features outlive their step"
    top = memory.kept[0]
    assert top.line.startswith("test_memory_window.py:") and top.line.endswith("in forward")
    assert any("in step" in caller for caller in top.callers)
    assert top.bytes >= BATCH * WIDTH * 4
    assert memory.kept_bytes_per_step >= top.bytes


def test_a_loop_that_keeps_nothing_leaves_nothing_behind() -> None:
    torch.manual_seed(0)
    model, x = Net(blocks=2), torch.randn(BATCH, WIDTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    memory = measured(step)
    assert memory.kept == () and memory.kept_bytes_per_step == 0


LEAK = '''
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
features = []
for step in range(500):  # ~1.5 s of readings after the windows: 90, and once 300, steps of 3 ms gave too few under load
    opt.zero_grad(set_to_none=True)
    hidden = model[1](model[0](x))
    features.append(hidden)  # kept for a plot, with its graph
    torch.nn.functional.cross_entropy(model[2](hidden), y).backward()
    opt.step()
'''

DIES = '''
import resource, sys
import torch
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # as a container's limit would
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x = torch.randn(262144, 512)  # a batch far too large
    model(x).square().mean().backward()
    opt.step()
'''


def test_a_loop_that_keeps_each_steps_features_is_told_its_leak_and_the_line(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "train.py").write_text(LEAK)
    result = run_gpuscope(["run", "--no-probes", "-q", "-o", str(tmp_path / "memory-run"), "train.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    record = RunRecord.from_json(load_run(tmp_path / "memory-run"))
    memory = record.memory
    assert memory is not None and memory.growth is not None and memory.growth.leak
    assert 0.7 * 128 * 1024 * 4 <= memory.growth.per_step_bytes <= 2 * 128 * 1024 * 4
    assert memory.kept[0].line == "train.py:10 in <module>"
    assert memory.kept[0].held_by.startswith("the list `features` (")
    assert (memory.kept[0].holder_kind, memory.kept[0].holder_name) == ("list", "features")
    assert memory.kept[0].holder_items >= 2
    leak = next(r for r in record.recommendations if r.id == "fix-memory-leak")
    assert leak.fix.startswith("train.py:10 in <module>: ")
    assert "Memory block of unknown size" not in result.stderr


def test_a_run_that_dies_of_memory_keeps_its_record_and_says_what_filled_it(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "train.py").write_text(DIES)
    result = run_gpuscope(["run", "--no-probes", "-o", str(tmp_path / "memory-run"), "train.py"], tmp_path)
    assert result.returncode == 1  # as under python
    assert "can't allocate memory" in result.stderr  # the script's own traceback
    assert (tmp_path / "memory-run" / "report.html").exists()
    record = RunRecord.from_json(load_run(tmp_path / "memory-run"))
    died = record.memory.out_of_memory  # type: ignore[union-attr]
    assert died is not None and died.device == "cpu" and died.requested_bytes
    assert died.parameters_bytes >= (512 * 2048 * 2 + 2048 + 512) * 4
    assert record.verdict.evidence[0].startswith("the script ran out of memory at step 0: RuntimeError: ")
    assert any(r.id == "reduce-memory" for r in record.recommendations)


KILLED = '''
import os, resource, signal, time
import torch
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for step in range(40):
    model(torch.randn(64, 256)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 20:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            vm = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), vm + (512 << 20)))  # a container's, as it were
        kept.append(torch.ones(450 << 20, dtype=torch.uint8))  # most of the room left
    if step == 30:
        time.sleep(2.5)  # the memory sampler's next reading
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
'''


def test_a_run_killed_outright_near_its_limit_still_gets_a_record_and_a_report(tmp_path) -> None:  # noqa: ANN001
    import time

    (tmp_path / "train.py").write_text(KILLED)
    out = tmp_path / "killed-run"
    result = run_gpuscope(["run", "--no-probes", "-q", "-o", str(out), "train.py"], tmp_path)
    assert result.returncode == -9 or result.returncode == 137
    deadline = time.monotonic() + 30  # the watcher writes them once it sees the run gone
    while not (out / "report.html").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    record = RunRecord.from_json(load_run(out))
    assert record.exit_status == 137
    assert record.memory is not None and record.memory.out_of_memory is not None
    assert record.verdict.evidence[0].startswith("the script was killed outright (SIGKILL")
    assert (out / "report.html").exists() and not (out / ".gpuscope-last-reading.json").exists()
    assert not (out / "faults.txt").exists()  # nothing struck it that faulthandler could see


def test_a_run_that_crashes_in_native_code_is_recorded_with_its_signal_and_line(tmp_path) -> None:  # noqa: ANN001
    import time

    (tmp_path / "train.py").write_text(
        "import ctypes\nimport torch\n\ndef native_crash():\n    ctypes.string_at(0)  # a C extension's bug\n\n"
        "model = torch.nn.Linear(8, 8)\nfor step in range(10):\n    model(torch.randn(4, 8)).sum().backward()\n"
        "    if step == 5:\n        native_crash()\n")
    out = tmp_path / "crashed-run"
    result = run_gpuscope(["run", "--no-probes", "-q", "-o", str(out), "train.py"], tmp_path)
    assert result.returncode == -11  # as under python: the process ends on the signal
    deadline = time.monotonic() + 30
    while not (out / "report.html").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    record = RunRecord.from_json(load_run(out))
    assert record.exit_status == 139
    assert "Segmentation fault (SIGSEGV)" in record.verdict.evidence[0]
    assert "called from the script's native_crash (train.py:5)" in record.verdict.evidence[0]
    assert "train.py\", line 11 in <module>" in (out / "faults.txt").read_text()


def test_a_run_that_ends_normally_leaves_no_watcher_and_no_reading_behind(tmp_path) -> None:  # noqa: ANN001
    from processes import processes_mentioning

    (tmp_path / "train.py").write_text("import time\nfor _ in range(30):\n    time.sleep(0.01)\n")
    out = tmp_path / "quiet-run"
    result = run_gpuscope(["run", "--no-probes", "-q", "-o", str(out), "train.py"], tmp_path)
    assert result.returncode == 0
    assert not (out / ".gpuscope-last-reading.json").exists() and not (out / "faults.txt").exists()
    assert processes_mentioning(str(out)) == []  # the watcher names the folder (run_gpuscope waits for them too)
