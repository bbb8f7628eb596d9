"""Helpers behind the ``zerobatch`` command: distributions, plots, a read benchmark."""

from __future__ import annotations

from zerobatch.tools.bench import bench
from zerobatch.tools.stats import Distributions, distributions, plot

__all__ = ["Distributions", "bench", "distributions", "plot"]
