"""Rules about the work that builds each item: what the dataset's own lines compute, and in what precision."""

from __future__ import annotations

from gpuscope.analysis import thresholds as th
from gpuscope.analysis.evidence import DATA_WAIT
from gpuscope.analysis.rules.base import Finding, rule
from gpuscope.record import DataProbe, LineCost, Loader, RunRecord

SHOWN_LINES = 3
"""float16 lines named in the evidence, heaviest first."""


@rule(id="fp32-preprocessing",
      title="Keep the CPU preprocessing in float32",
      fix="compute in float32 (`x = x.astype(np.float32)` first) and cast to float16 at the end, or on the GPU",
      needs=("loaders", "data_probe"),
      resolved_by=(DATA_WAIT,))
def fp32_preprocessing(run: RunRecord) -> Finding | None:
    """Signal: steps wait for data for a notable share of their time, and a notable share of building an item
    (measured by the data probe, line by line) is on lines of the user's dataset that produce float16 arrays or
    tensors, on a machine where NumPy's float16 arithmetic is measured markedly slower than float32.
    Why it matters: most CPUs have no float16 arithmetic; NumPy converts every element to float32 and back
    around each operation, so float16 preprocessing is several times slower than the same math in float32
    (keeping the preprocessing in fp32 took a ResNet-50 training run from 5.07 to 7.69 it/s).
    Fix: convert to float32 first, do the math, and cast to float16 at the end (or on the GPU). Expected gain:
    data wait x float16 share of the item x (1 - 1/slowdown); unknown when the slowdown was not measured."""
    probe: DataProbe = run.data_probe  # type: ignore[assignment]
    share = run.breakdown.data_wait
    if share < th.DATA_WAIT_NOTABLE or probe.item_s <= 0:
        return None
    float16_share = min(1.0, probe.float16_s / probe.item_s)
    slowdown = probe.numpy_float16_slowdown
    if float16_share < th.FLOAT16_SHARE_NOTABLE or (slowdown is not None and slowdown < th.FLOAT16_SLOWDOWN_NOTABLE):
        return None
    heavy = [line for line in probe.lines if line.float16][:SHOWN_LINES]
    evidence = [
        f"{share:.0%} of each step waits for the next batch (median step {run.steps.median_s * 1e3:.1f} ms)",
        f"{float16_share:.0%} of fetching one {probe.dataset} {_fetched(probe)} ({probe.float16_s * 1e3:.1f} ms of "
        f"{probe.item_s * 1e3:.1f} ms, under a line tracer) is on lines producing float16 data"
        + (": " + ", ".join(f"{_where(line)} `{line.code}` ({line.own_s * 1e3:.1f} ms)" for line in heavy)
           if heavy else ""),
    ]
    if slowdown is not None:
        evidence.append(f"NumPy float16 arithmetic ran {slowdown:.1f}x slower than float32 on this machine")
    loader = _loader_of(run, probe.dataset)
    half = [t for t in loader.batch_tensors if t.startswith("float16[")]
    if half:
        evidence.append(f"the {loader.dataset} loader's batches hold {', '.join(half)}")
    gain = share * float16_share * (1 - 1 / slowdown) if slowdown is not None else None
    return Finding(gain, tuple(evidence), fix=_fix(heavy, numpy=slowdown is not None))


def _fetched(probe: DataProbe) -> str:
    """What one fetch of the probed dataset gave: an item, or a batch where the dataset fetches whole batches."""
    return f"batch of {probe.batch_items} items" if probe.batch_items else "item"


def _where(line: LineCost) -> str:
    return f"{line.file}:{line.line}"


def _loader_of(run: RunRecord, dataset: str) -> Loader:
    """The loader over the probed dataset (the one waited on longest, if several share its class)."""
    matching = [loader for loader in run.loaders if loader.dataset == dataset] or list(run.loaders)
    return max(matching, key=lambda loader: loader.wait_s)


def _fix(lines: list[LineCost], numpy: bool) -> str:
    """The rule's fix with the lines to change in front of it (``data.py:42, :45``)."""
    convert = "`x = x.astype(np.float32)`" if numpy else "`x = x.float()`"
    advice = f"compute in float32 ({convert} first) and cast to float16 at the end, or on the GPU"
    if not lines:
        return advice
    places = [_where(lines[0])]
    places += [f":{line.line}" if line.file == lines[0].file else _where(line) for line in lines[1:]]
    return f"{', '.join(places)}: {advice}"
