"""Test-session setup shared by every test file."""

from __future__ import annotations

import os

# JAX reads these once, when it first starts: 8 CPU devices for the mesh tests.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
