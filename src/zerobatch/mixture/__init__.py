"""Weighted mixtures of sources: one exact order, weights that change without a repeat or a skip."""

from __future__ import annotations

from zerobatch.mixture.mixture import Mixture
from zerobatch.mixture.order import DEFAULT_BLOCK_SIZE, MixtureOrder, Stage

__all__ = ["DEFAULT_BLOCK_SIZE", "Mixture", "MixtureOrder", "Stage"]
