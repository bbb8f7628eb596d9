"""The batch service over ZeroMQ: a field store for post-training, speaking F + 1 frames.

``FieldStoreServer``/``FieldStore`` keep fields of samples that producers put
and consumer tasks get once each (seed 002). Servers bind loopback by default;
other interfaces need CURVE keys (:class:`CurveKeys`) or ``insecure=True``.
"""

from __future__ import annotations

from zerobatch.service._transport import CurveKeys, ServiceError
from zerobatch.service.fieldstore import FieldStore, FieldStoreServer, FieldTable

__all__ = ["CurveKeys", "FieldStore", "FieldStoreServer", "FieldTable", "ServiceError"]
