"""gpuscope: why is my training loop slow, and which few lines make it faster?"""

from __future__ import annotations

from gpuscope.api import Profile, profile
from gpuscope.markers import step
from gpuscope.notebook import load_ipython_extension

__version__ = "0.1.0"

__all__ = ["Profile", "__version__", "load_ipython_extension", "profile", "step"]
