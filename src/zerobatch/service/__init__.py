"""The batch service over ZeroMQ, speaking F + 1 frames.

* ``BatchServer``/``BatchClient``: training batches over the network. Servers
  are stateless; clients have the Loader's interface and state.
* ``FieldStoreServer``/``FieldStore``: fields of samples that producers put and
  consumer tasks get once each (seed 002's post-training use).

Servers bind loopback by default; other interfaces need CURVE keys
(:class:`CurveKeys`) or ``insecure=True``.
"""

from __future__ import annotations

from zerobatch.service._transport import CurveKeys, ServiceError
from zerobatch.service.batches import BatchServer
from zerobatch.service.client import BatchClient
from zerobatch.service.fieldstore import FieldStore, FieldStoreServer, FieldTable

__all__ = [
    "BatchClient",
    "BatchServer",
    "CurveKeys",
    "FieldStore",
    "FieldStoreServer",
    "FieldTable",
    "ServiceError",
]
