"""gpuscope: why is my training loop slow, and which few lines make it faster?"""

from __future__ import annotations

from gpuscope.markers import step

__version__ = "0.1.0"

__all__ = ["__version__", "step"]
