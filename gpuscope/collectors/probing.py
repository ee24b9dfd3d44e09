"""What the post-run probes share: they run the user's code again after the script has ended, so they leave no
trace of it (the global RNG states are restored, whatever it prints is swallowed) and turn its failures into one
line for the record."""

from __future__ import annotations

import contextlib
import io
import random
import sys
import warnings
from collections.abc import Iterator


class DatasetError(Exception):
    """The user's dataset (or collate function) raised while a probe loaded it (the message is the reason)."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, at most ``limit`` characters."""
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else ""


def dataset_error(exc: BaseException, doing: str) -> DatasetError:
    """A DatasetError saying what the dataset raised while the probe was ``doing`` it."""
    message = first_line(exc)
    return DatasetError(f"the dataset raised {type(exc).__name__}{': ' + message if message else ''} {doing}")


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's global RNG states afterwards: the probe changes nothing the user
    would see, however the dataset draws its randomness."""
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=[]) if torch is not None else contextlib.nullcontext():
            yield
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def unseen() -> Iterator[None]:
    """RNG states kept, and what the user's code prints or warns while probed swallowed: it is not the run's."""
    with rng_kept(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
