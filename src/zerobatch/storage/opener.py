"""``open_storage``: the ``Storage`` for a dataset location (path or URL)."""

from __future__ import annotations

import os
from typing import Any

from zerobatch.storage.local import LocalStorage
from zerobatch.storage.object import ObjectStorage
from zerobatch.storage.url import is_url, local_path

__all__ = ["open_storage"]


def open_storage(location: str | os.PathLike[str], **storage_options: Any) -> Any:
    """The ``Storage`` for the folder or prefix at ``location``.

    Local paths and ``file://`` URLs give ``LocalStorage``; its one option is
    ``method``: ``"auto"`` (default: memory maps on local file systems,
    ``pread`` on network and FUSE ones and wherever the type cannot be told),
    ``"mmap"`` or ``"pread"`` (use ``"pread"`` where files may be truncated in
    place while a job reads them: a mapping then dies of SIGBUS, see
    ``zerobatch.storage.local``). ``s3://``, ``gs://`` and
    ``az://`` give ``ObjectStorage`` (needs the ``cloud`` extra): credentials and
    endpoints come from the cloud's environment variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, ``GOOGLE_SERVICE_ACCOUNT``,
    ``AZURE_STORAGE_ACCOUNT_NAME``, ...) or from ``storage_options``, obstore's
    own keyword arguments (``config``, config keys, ``client_options``,
    ``retry_config``, ``credential_provider``), passed through unchanged.
    """
    if is_url(location):
        return ObjectStorage(str(location), **storage_options)
    unknown = sorted(set(storage_options) - {"method"})
    if unknown:
        raise ValueError(f"{location!r} is a local path; storage_options {unknown} apply only "
                         "to object-store URLs (LocalStorage takes method='auto'|'pread'|'mmap')")
    return LocalStorage(local_path(location), **storage_options)
