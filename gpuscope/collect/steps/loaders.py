"""DataLoaders as the steps collector sees them: each configuration's settings, read off its iterator (private
attributes, so every read is optional), the tensors of its first batch, the line that built it, and what the
post-run probes need to build it again. Kept strongly: the script's loader may be gone by the end."""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from gpuscope.collect.batch_fetch import is_default_collate
from gpuscope.collect.callsites import call_site, calling_library, is_user_file, user_frame
from gpuscope.record import CallSite, Loader

MAX_LOADERS = 16
"""Distinct DataLoader configurations described in the record."""
MAX_BATCH_TENSORS = 8
FINGERPRINT_BYTES = 16 * 2**20
"""The first batch from each worker of an IterableDataset's loader is hashed (to tell workers that each yield the
whole stream) where its tensors hold at most this much: a few milliseconds, once."""
MAX_CREATED = 256
"""Datasets whose first DataLoader's line is remembered (a script building loaders in a loop stops adding here)."""
BACK_TO_BACK_S = 0.001
"""A batch asked for within this long of the previous one's arrival was taken back to back with it (a loop that takes
several batches at once, as the transformers Trainer takes a step's accumulated batches first)."""


class LoaderBook:
    """The DataLoader configurations iterated in the loop: batches and time waited for each."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._created: dict[int, tuple[Any, CallSite, str, str]] = {}
        """By the dataset's id: the dataset (a weak reference), the line, the library and the batch sampler passed."""
        self.fed_by_thread = False
        """Whether a thread other than the loop's has taken DataLoader batches (a prefetching thread)."""
        self._open: dict[tuple[int, bool], list[Any]] = {}  # the open span's [loader entry, batches, wait, its
        # iterator (weakly, or None)], by the entry's id and whether the iterator is the one that fed training spans
        self._tracker: Any = None  # the StepTracker whose spans the batches are counted in (``follow``)
        self._pending: list[list[Any]] = []  # an evaluated span's [entry, batches, wait, iterator (weakly)] from
        # iterators that had fed no training: evaluation's, unless the iterator feeds the next span (``step_closed``)
        self._last: tuple[weakref.ref[Any], dict[str, Any]] | None = None  # the last batch's iterator, and its entry
        self.watch_batches = False
        """Whether ``last_batch`` is kept (while a frozen model is timed: ``frozen_models``)."""
        self.last_batch: tuple[tuple[weakref.ref[Any], ...], bool] = ((), False)
        """The last batch's tensors, weakly (none where a collate function of the script's own built it), and whether
        its dataset gives the same items every time it is read (a TensorDataset's, or a Subset's of one), while
        ``watch_batches``."""

    def wrap_init(self, original: Callable[..., None]) -> Callable[..., None]:
        """``DataLoader.__init__``, noting the line that built each loader."""
        book = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            original(loader, *args, **kwargs)
            try:
                book.loader_created(getattr(loader, "dataset", None), sys._getframe(1), _passed_sampler(loader))
            except Exception:  # the line is a nicety; the user's loader is built either way
                pass

        return __init__

    def take_elsewhere(self, original: Callable[[Any], Any], iterator: Any, clock: Callable[[], float]) -> Any:
        """``original(iterator)``, the next batch, taken in a thread other than the loop's (a prefetching thread that
        hands batches to the loop): counted for its loader, with the time it took to come."""
        self.fed_by_thread = True
        start = clock()
        batch = original(iterator)
        self.count_batch(iterator, batch, clock() - start, requested=start)
        return batch

    def loader_created(self, dataset: Any, frame: FrameType | None, batch_sampler: str = "") -> None:
        """A DataLoader over ``dataset`` was constructed, called from ``frame``, with the batch sampler the caller
        passed (its class, or ""): the first such line of the user's code is the one to change (a framework that
        builds the loader again over the same dataset, as Lightning does to add its sampler or accelerate to shard
        its batches, does not move it), with the library that built it, if not the user's code."""
        if len(self._created) >= MAX_CREATED:
            return
        known = self._created_for(dataset)
        site = call_site(user_frame(frame) if frame is not None else None)
        if known is not None and site.file and (site.file, site.line) == (known[1].file, known[1].line) \
                and not calling_library(frame):
            # the user's line again, itself: a new DataLoader each epoch, say (``calls`` counts them; a library's
            # that the line called, as Lightning's trainer.fit(model, DataLoader(...)) builds one again, is none)
            self._created[id(dataset)] = (known[0], dataclasses.replace(known[1], calls=known[1].calls + 1),
                                          *known[2:])
            return
        if known is not None and known[0] is not None:
            return
        try:
            ref: Any = weakref.ref(dataset)
        except TypeError:  # no weak references (``__slots__``): the id alone, and the latest DataLoader's line
            ref = None
        self._created[id(dataset)] = (ref, site, calling_library(frame), batch_sampler)

    def _created_for(self, dataset: Any) -> tuple[Any, CallSite, str, str] | None:
        """The line noted for ``dataset``: its entry, if the dataset it was noted for is this one (an id alone, for
        a dataset without weak references, is taken at its word)."""
        created = self._created.get(id(dataset))
        if created is None or (created[0] is not None and created[0]() is not dataset):
            return None
        return created

    def count_batch(self, iterator: Any, batch: Any, wait_s: float, requested: float | None = None) -> None:
        """One batch came out of ``iterator`` after ``wait_s``, asked for at ``requested`` (the clock's time)."""
        last = self._last  # (the last batch's iterator, weakly, and its entry): the same iterator, at most batches
        if last is not None and last[0]() is iterator:
            entry = last[1]
        else:
            entry = self._entry_of(iterator, batch, wait_s)
            if entry is None:
                return
        workers = entry["info"]["num_workers"]
        if entry["info"]["iterable"] and workers > 1 and entry["batches"] < workers:
            _note_first(entry, batch)  # one batch from each worker, the first time the loader is iterated
        entry["batches"] += 1
        entry["wait_s"] += wait_s
        if self.watch_batches:
            self.last_batch = (_tensor_refs(batch) if entry["as_loaded"] else (), entry["fixed_items"])
        if not self._open and self._tracker is not None:
            self._tracker.on_span_end = self.step_closed
        ref = last[0] if (last := self._last) is not None and last[1] is entry else None
        training = ref is not None and (fed := entry["training"]) is not None and fed() is iterator
        opened = self._open.setdefault((id(entry), training), [entry, 0, 0.0, ref])
        opened[1] += 1
        opened[2] += wait_s
        if requested is not None:
            arrived = entry["arrived"]
            if arrived is not None and requested - arrived < BACK_TO_BACK_S:
                entry["back_to_back"] += 1
            entry["arrived"] = requested + wait_s

    def _entry_of(self, iterator: Any, batch: Any, wait_s: float) -> dict[str, Any] | None:
        """The entry of ``iterator``'s loader (made at its first batch; None past MAX_LOADERS), for a batch from an
        iterator other than the last batch's: a new iterator's first batch is counted as a restart of its workers."""
        dataset = getattr(iterator, "_dataset", None)
        key = (type(dataset).__name__, id(dataset), getattr(iterator, "_num_workers", 0), _batch_size(iterator))
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_LOADERS:
                return None
            info = _describe(iterator)
            info["batch_tensors"] = tuple(describe_tensors(batch))
            created = self._created_for(dataset)
            if created is not None:
                info["created_at"], info["created_by"], info["batch_sampler"] = created[1:]
            loading = _loading(iterator)
            entry = self._entries[key] = {"info": info, "batches": 0, "wait_s": 0.0, "dataset": dataset,
                                          "loading": loading, "iterators": weakref.WeakSet(),
                                          "restarts": 0, "restart_wait_s": 0.0, "back_to_back": 0,
                                          "arrived": None, "eval_batches": 0, "eval_wait_s": 0.0, "firsts": [],
                                          "training": None,  # the iterator that fed a span with no evaluation
                                          "repeated": 0, "length": _length(iterator),
                                          # (for ``last_batch``): its batches are its items as they are, collated by
                                          # torch (a collate function of one's own may draw at random: mixup), and
                                          # those items are the same each epoch by what the dataset is
                                          "as_loaded": _plain_collate(loading["collate_fn"]),
                                          "fixed_items": fixed_items(dataset)}
        if _first_from(entry["iterators"], iterator) and entry["batches"] and getattr(iterator, "_num_workers", 0):
            entry["restarts"] += 1  # a new iterator's workers started for this batch
            entry["restart_wait_s"] += wait_s
        try:
            self._last = (weakref.ref(iterator), entry)
        except TypeError:  # no weak references: found by its key at each batch
            self._last = None
        return entry

    def follow(self, tracker: Any) -> None:
        """Be ``tracker``'s ``on_span_end`` (``step_closed``) while a span has batches counted, and only then: a
        loop with no DataLoader is not told of each step's end. (With a thread taking the batches, always, once it
        took one: the loop's thread never unsets it while that thread may be counting.)"""
        self._tracker = tracker

    def step_closed(self, evaluated: bool) -> None:
        """A span ended (a step, or the time between epochs or after the last one): where it held an evaluation
        pass, its batches count for the loaders' evaluation, but for those of an iterator that fed a span with none
        (the training loop's, in a step that accumulates 4 batches and also validates: Lightning's
        ``val_check_interval``) or goes on to feed the next span that holds batches (a new epoch's, whose first
        batches came in the span that evaluated after the last epoch: the Trainer's, zipped loaders built each
        epoch). (A thread taking batches may note one meanwhile: the open loaders are swapped out and copied, never
        iterated live.)"""
        opened = self._open
        if not self.fed_by_thread and self._tracker is not None:
            self._tracker.on_span_end = None
        if not opened:
            return
        self._open = {}
        if not evaluated:  # the last evaluated span's batches are training's where their iterator goes on here
            fed = [iterator for *_, ref in opened.values() if ref is not None and (iterator := ref()) is not None]
            self._pending = [held for held in self._pending
                             if held[3] is None or not any(held[3]() is iterator for iterator in fed)]
        self._settle()
        for (_, training), (entry, batches, wait_s, ref) in list(opened.items()):
            if not evaluated:
                entry["training"] = ref
            elif not training:
                self._pending.append([entry, batches, wait_s, ref])

    def _settle(self) -> None:
        """The batches still pending are evaluation's (the next span did not take them for training, or the run is
        over)."""
        for entry, batches, wait_s, _ in self._pending:
            entry["eval_batches"] += batches
            entry["eval_wait_s"] += wait_s
        self._pending = []

    def epoch_steps(self, steps: int) -> int | None:
        """The steps an epoch of the loader most training batches came from holds, from its length and the batches
        the first ``steps`` steps took of it, rounded down (gradient accumulation's several a step): the next step's
        batch may be counted already, and another after it where the loader looks one batch ahead (accelerate's, under
        the Transformers Trainer: 3 batches by 2 steps, rounded, made a 5-batch epoch 2 steps); None where it has no
        length (an IterableDataset's) or took no training batch. An evaluation pass's batches are no training
        batches: minGPT's evaluates 100 batches of its own loaders inside step 1, whose epochs of 95 and 5 batches
        were taken for an epoch of 2 steps."""
        pending: dict[int, int] = {}  # (batches of the last evaluated span still pending: evaluation's for now)
        for held, batches, *_ in self._pending:
            pending[id(held)] = pending.get(id(held), 0) + batches
        entry = max(self._entries.values(), key=lambda e: e["batches"] - e["eval_batches"] - pending.get(id(e), 0),
                    default=None)
        training = entry["batches"] - entry["eval_batches"] - pending.get(id(entry), 0) if entry is not None else 0
        if entry is None or entry["length"] is None or training <= 0 or steps <= 0:
            return None
        return entry["length"] // max(1, training // steps)

    def _by_wait(self) -> list[dict[str, Any]]:
        """The loaders, the one the training steps waited on longest first (evaluation passes left out: a test set
        read slowly between epochs is not what the training waits on)."""
        return sorted(self._entries.values(), key=lambda e: -(e["wait_s"] - e["eval_wait_s"]))

    def probe_dataset(self) -> tuple[Any, int | None]:
        """The map-style dataset the training steps waited on longest (for the data probe), or None; and where it
        fetches whole batches, the indices its loader asked for at a time (``_loading``)."""
        for entry in self._by_wait():
            if not entry["info"]["iterable"] and entry["dataset"] is not None:
                return entry["dataset"], entry.get("loading", {}).get("fetch")
        return None, None

    def probe_loader(self) -> dict[str, Any] | None:
        """What the loader probe needs of the loader the training steps waited on longest: its description
        (``info``), ``batches`` and ``wait_s`` as measured (evaluation passes left out), and the ``dataset``,
        ``collate_fn``, ``drop_last``, ``worker_init_fn`` and ``fetch`` it loaded with; None when no DataLoader was
        iterated."""
        self._settle()
        for entry in self._by_wait():
            return {"info": entry["info"], "batches": entry["batches"] - entry["eval_batches"],
                    "wait_s": entry["wait_s"] - entry["eval_wait_s"], "dataset": entry["dataset"],
                    **entry.get("loading", {})}
        return None

    def records(self) -> tuple[Loader, ...]:
        """The loaders for the record, the longest waited on first."""
        self._settle()
        return tuple(Loader(batches=e["batches"], wait_s=e["wait_s"], restarts=e["restarts"],
                            restart_wait_s=e["restart_wait_s"], back_to_back=e["back_to_back"],
                            eval_batches=e["eval_batches"], eval_wait_s=e["eval_wait_s"],
                            repeated_first_batches=e["repeated"], **self._info(e))
                     for e in self._by_wait())

    def _info(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry's description, with its line's count of the loaders it built as of now (taken at its first
        batch, it would miss those built for later epochs)."""
        created = self._created_for(entry["dataset"]) if "created_at" in entry["info"] else None
        return {**entry["info"], "created_at": created[1]} if created is not None else entry["info"]


def _length(iterator: Any) -> int | None:
    """The batches an epoch of ``iterator``'s loader holds (``len``), or None where it has none."""
    try:
        length = len(iterator)
    except Exception:  # an IterableDataset without __len__ (TypeError), or whatever a user's __len__ raises
        return None
    return length if isinstance(length, int) and length > 0 else None


def _note_first(entry: dict[str, Any], batch: Any) -> None:
    """Count ``batch`` as repeated where an earlier first batch of the loader had the same contents."""
    mark = fingerprint(batch)
    if mark is not None:
        entry["repeated"] += mark in entry["firsts"]
        entry["firsts"].append(mark)


def fingerprint(batch: Any, limit: int = FINGERPRINT_BYTES) -> int | None:
    """A hash of a batch's CPU tensors (their dtype, shape and bytes), or None where it holds none, a tensor on
    another device, or more than ``limit`` bytes of them."""
    tensors = [a for a in batch_arrays(batch) if hasattr(a, "untyped_storage")]  # torch's, not NumPy's
    if not tensors or sum(t.numel() * t.element_size() for t in tensors) > limit \
            or any(t.device.type != "cpu" for t in tensors):
        return None
    uint8 = sys.modules["torch"].uint8
    try:
        return hash(tuple((str(t.dtype), tuple(t.shape), t.detach().contiguous().view(-1).view(uint8).numpy()
                           .tobytes()) for t in tensors))
    except Exception:  # a tensor subclass, a dtype whose bytes cannot be viewed: no fingerprint
        return None


def _first_from(seen: weakref.WeakSet[Any], iterator: Any) -> bool:
    """Whether this is ``iterator``'s first batch (it is then noted in ``seen``); False for an iterator that cannot
    be noted (no weak references)."""
    try:
        if iterator in seen:
            return False
        seen.add(iterator)
    except TypeError:
        return False
    return True


def _passed_sampler(loader: Any) -> str:
    """The class of the batch sampler passed as ``DataLoader(..., batch_sampler=...)``, or "" where the DataLoader
    made its own from its batch_size."""
    sampler = getattr(loader, "batch_sampler", None)
    return type(sampler).__name__ if sampler is not None and getattr(loader, "batch_size", None) is None else ""


def _batch_size(iterator: Any) -> int | None:
    sampler = getattr(iterator, "_index_sampler", None)
    size = getattr(sampler, "batch_size", None)
    return size if isinstance(size, int) else None



def _tensor_refs(batch: Any) -> tuple[weakref.ref[Any], ...]:
    """Weak references to the batch's tensors (an identity check that a freed tensor's address, reused, cannot pass)."""
    refs = []
    for array in batch_arrays(batch):
        try:
            refs.append(weakref.ref(array))
        except TypeError:
            pass
    return tuple(refs)


def fixed_items(dataset: Any) -> bool:
    """Whether ``dataset`` gives the same items every time it is read, by what it is: torch's ``TensorDataset``
    (indexing tensors), or a ``Subset`` of one. Any other dataset may transform its items at random."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    data = torch.utils.data
    while type(dataset) is data.Subset:
        dataset = dataset.dataset
    return type(dataset) is data.TensorDataset


def _plain_collate(collate_fn: Any) -> bool:
    """Whether ``collate_fn`` is torch's own: ``default_collate`` (``batch_size`` set) or ``default_convert`` (not)."""
    return is_default_collate(collate_fn) or collate_fn is sys.modules["torch"].utils.data.default_convert


def describe_tensors(batch: Any) -> list[str]:
    """The tensors (and NumPy arrays) in a batch, as ``dtype[shape] device``, first MAX_BATCH_TENSORS of them."""
    return [f"{str(a.dtype).removeprefix('torch.')}[{', '.join(str(int(d)) for d in a.shape)}] "
            f"{getattr(a, 'device', 'cpu')}" for a in batch_arrays(batch)]


def batch_arrays(batch: Any, depth: int = 0) -> list[Any]:
    """The tensors (and NumPy arrays) in a batch, in order, first MAX_BATCH_TENSORS of them: the batch itself, or
    those in its dicts' values and its lists and tuples, four levels down."""
    if getattr(batch, "shape", None) is not None and getattr(batch, "dtype", None) is not None:
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    found: list[Any] = []
    if isinstance(batch, (list, tuple)) and depth < 4:
        for item in batch:
            found.extend(batch_arrays(item, depth + 1))
            if len(found) >= MAX_BATCH_TENSORS:
                return found[:MAX_BATCH_TENSORS]
    return found


def _loading(iterator: Any) -> dict[str, Any]:
    """How a DataLoader builds its batches, read off its iterator, for the probes to fetch as it did: its collate
    function, drop_last, worker set-up, and ``fetch``: where the dataset itself fetches whole batches (a
    ``BatchSampler`` passed as ``sampler`` with ``batch_size=None``, the fast path for tabular data: each
    ``dataset[indices]`` gets a list), the indices a fetch asks for, else None (one index a fetch)."""
    sampler = getattr(iterator, "_index_sampler", None)
    return {
        "collate_fn": getattr(iterator, "_collate_fn", None),
        "drop_last": bool(getattr(sampler, "drop_last", getattr(iterator, "_drop_last", False))),
        "worker_init_fn": getattr(iterator, "_worker_init_fn", None),
        "fetch": _batch_size(iterator) if getattr(iterator, "_auto_collation", True) is False else None,
        "index_sampler": sampler,
    }


def _describe(iterator: Any) -> dict[str, Any]:
    """A DataLoader's settings, read off its iterator (private attributes, so every read is optional)."""
    dataset = getattr(iterator, "_dataset", None)
    kind = getattr(iterator, "_dataset_kind", 0)
    workers = getattr(iterator, "_num_workers", 0)
    context = None
    if workers:
        for worker in getattr(iterator, "_workers", ()) or ():
            # SpawnProcess...: the loader's own multiprocessing_context; a plain Process: the default context's
            # (multiprocessing.set_start_method, or the platform's own), fixed once a worker has started
            own = type(worker).__name__.replace("Process", "").lower()
            context = own or multiprocessing.get_start_method(allow_none=True)
            break
    prefetch = getattr(iterator, "_prefetch_factor", None)
    init_fn = getattr(iterator, "_worker_init_fn", None)
    return {
        "dataset": type(dataset).__name__,
        "num_workers": workers if isinstance(workers, int) else 0,
        "batch_size": _batch_size(iterator),
        "pin_memory": bool(getattr(iterator, "_pin_memory", False)),
        "persistent_workers": bool(getattr(iterator, "_persistent_workers", False)),
        "prefetch_factor": prefetch if isinstance(prefetch, int) else None,
        "start_method": {"fork": "fork", "spawn": "spawn", "forkserver": "forkserver"}.get(context or ""),
        "iterable": kind == 1,
        "shards_by_worker": splits_its_stream(dataset, init_fn) if kind == 1 else None,
    }


def splits_its_stream(dataset: Any, worker_init_fn: Any) -> bool | None:
    """Whether an IterableDataset's workers would each take their own part of its stream: its class's own code (and
    the functions of the user's it calls, a few levels down), or the loader's ``worker_init_fn``, names
    ``get_worker_info``, torch's documented way to split it. False where the class is the user's, no
    ``worker_init_fn`` is given and none of that code names it; None where it cannot be told (a class from an
    installed library: Hugging Face's streaming datasets split their shards in code of their own)."""
    try:
        classes = [cls for cls in type(dataset).__mro__ if _users(cls)]
        found = [f for cls in classes for f in vars(cls).values()]
        if worker_init_fn is not None:
            found.append(getattr(worker_init_fn, "func", worker_init_fn))  # a functools.partial's function
        if any(_names_worker_info(f, depth=3) for f in found):
            return True
    except Exception:
        return None
    mro = type(dataset).__mro__
    own = classes[:1] == [mro[0]] and all(cls in classes or cls.__module__.split(".")[0] in TORCH_AND_STDLIB
                                          for cls in mro)
    return False if own and worker_init_fn is None else None


TORCH_AND_STDLIB = frozenset({"torch", "builtins", "typing", "collections", "abc"})
"""Where the classes an IterableDataset of the user's may derive from come from, besides the user's code (torch's
IterableDataset derives from typing.Generic and collections.abc.Iterable): any other base (an installed library's)
may split the stream in code of its own."""


def _names_worker_info(function: Any, depth: int) -> bool:
    """Whether ``function``'s code, a function nested in it, or a function of the user's it calls by a global name
    (``depth`` levels down), names ``get_worker_info``."""
    function = getattr(function, "__func__", function)  # a method's function
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    found = _code_names(code)
    if "get_worker_info" in found:
        return True
    if depth <= 0:
        return False
    scope = getattr(function, "__globals__", {})
    return any(_names_worker_info(f, depth - 1) for name in found
               if callable(f := scope.get(name)) and _users_function(f))


def _code_names(code: Any) -> set[str]:
    """The global and attribute names ``code`` and the functions nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _users(cls: type) -> bool:
    """Whether ``cls`` is defined in the user's code (``callsites.is_user_file``)."""
    return is_user_file(getattr(sys.modules.get(cls.__module__), "__file__", None) or "")


def _users_function(function: Any) -> bool:
    return hasattr(function, "__code__") and is_user_file(function.__code__.co_filename)
