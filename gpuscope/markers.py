"""``gpuscope.step()``: an explicit step marker usable from anywhere, a no-op when nothing is profiling."""

from __future__ import annotations


def step() -> None:
    """Mark the end of one step (and the start of the next).

    Needed only for loops with no ``optimizer.step()``: inference, custom updates. Under ``gpuscope run`` or
    inside ``gpuscope.profile()`` explicit marks take precedence over the automatic ones; elsewhere this
    does nothing, so scripts can keep the call.
    """
    from gpuscope.session import active_session

    session = active_session()
    if session is not None:
        session.mark_step()
