"""Rules about streams: an IterableDataset read by several DataLoader workers."""

from __future__ import annotations

from gpuscope.diagnose.evidence import Metric
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.diagnose.rules.dataloader import built_at, split_lines
from gpuscope.record import RunRecord

REPEATED_FIRST_BATCHES = Metric(
    "repeated first batches", "number",
    lambda r: float(sum(loader.repeated_first_batches for loader in r.loaders)) if r.loaders else None)


@rule(id="split-iterable-stream",
      title="Give each DataLoader worker its own share of the stream",
      fix="info = torch.utils.data.get_worker_info()  # in the IterableDataset's __iter__: skip the items of the "
          "other workers",
      needs=("loaders",),
      resolved_by=(REPEATED_FIRST_BATCHES,),
      trial=Refused("it is a change to your IterableDataset's code"))
def split_iterable_stream(run: RunRecord) -> Finding | None:
    """Signal: a DataLoader's N workers over an IterableDataset of the script's own gave the same first batch, and
    the dataset's code never calls ``get_worker_info()`` (``loaders[].shards_by_worker``): each worker yields the
    whole stream.
    Why it matters: every batch is trained on N times; an epoch takes N times the steps its data needs (torch's
    documentation: "each worker will get a replica of the dataset object ... duplicate data"). The step itself is
    no slower, so no share of the step is promised: the epoch is what shrinks, to 1/N.
    Fix: in ``__iter__``, each worker skips the items of the others (``i % info.num_workers != info.id``) before
    any work on them."""
    loader = next((each for each in run.loaders if each.iterable and each.num_workers > 1
                   and each.shards_by_worker is False and each.repeated_first_batches), None)
    if loader is None:
        return None
    n, name = loader.num_workers, loader.dataset
    evidence = (
        f"the {name} loader's {n} workers gave the same first batch ({loader.repeated_first_batches} of the first "
        f"{n} batches repeated an earlier one)",
        f"the {name} IterableDataset's code never calls torch.utils.data.get_worker_info(): each worker yields the "
        f"whole stream, so every batch is trained on {n} times and an epoch takes {n}x the steps its data needs",
    )
    return Finding(None, (*evidence, *built_at(loader)), fix=f"#{split_lines(name)}")
