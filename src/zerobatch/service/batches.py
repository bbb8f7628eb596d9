"""``BatchServer``: any Loader source served over ZeroMQ, stateless.

A request names the plan (``seed``, ``epoch``, global position ``consumed``,
``rank``, ``world_size``, ``batch_size``, ``shuffle``, ``drop_last``,
``block_size``); the reply is that rank's batch at that position, as the
F + 1 frames of :meth:`Batch.to_frames`, computed with :class:`zerobatch.plan.Plan`.
The server keeps no per-client state, so many servers can serve the same
dataset and any of them can answer any request.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from zerobatch.columnar.wire import expect
from zerobatch.errors import FormatError
from zerobatch.service._transport import CurveKeys, Server, no_payload
from zerobatch.source import fingerprint, read_step, source_state

__all__ = ["PLAN_KEYS", "BatchServer", "serve_dataset"]

PLAN_KEYS: dict[str, type | tuple[type, ...]] = {
    "seed": int,
    "epoch": int,
    "consumed": int,
    "rank": int,
    "world_size": int,
    "batch_size": int,
    "shuffle": bool,
    "drop_last": bool,
    "block_size": (int, type(None)),
}
"""The keys of a ``batch`` request and their msgpack types."""

_PLANS_KEPT = 16
_MAX_WORLD_SIZE = 1 << 20


class BatchServer(Server):
    """Serves ``source`` (``len`` and ``read(indices) -> Batch``) until :meth:`stop`.

    Args:
        source: any Loader source: TokenWindows, Documents, a batch file reader...
        address: where to bind (``tcp://127.0.0.1:0``-style picks a free port;
            ``server.address`` is the bound endpoint). Other interfaces than
            loopback need ``curve`` unless ``insecure=True`` (which logs a warning).
        curve: the server's CURVE key pair; clients then need its public key.
        allowed_clients: CURVE public keys allowed to connect (None: any client
            that knows the server key).
        max_message_bytes: the largest request accepted (requests are small headers).
        max_batch_size: the largest ``batch_size`` a request may ask for (rows).

    Ops: ``info`` answers ``length``, ``fingerprint``, ``ordered`` and ``source``
    (a stateful source's description, as the Loader's state holds it), and for
    packed rows ``packed`` (their ``collate_options``); ``batch`` answers one
    batch, with the Loader's boolean ``padding`` column when ``drop_last=False``;
    ``epoch`` (packed rows, the batch keys) answers the epoch's ``rows`` and the
    state's ``cursor`` at ``consumed``.
    Thread safety: serve from one thread; ``source.read`` is only called there.
    """

    def __init__(
        self,
        source: Any,
        address: str = "tcp://127.0.0.1:5555",
        *,
        curve: CurveKeys | None = None,
        allowed_clients: Collection[bytes] | None = None,
        insecure: bool = False,
        max_message_bytes: int = 1 << 20,
        max_batch_size: int = 1 << 16,
    ) -> None:
        self.source = source
        self.max_batch_size = max_batch_size
        self._plans: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        # a source with its own plan (packed rows): the plan's length (documents), not len()
        bind = getattr(source, "bind_plan", None)
        self._length = bind(1)[0].length if callable(bind) else len(source)
        super().__init__(
            address,
            self._handle,
            curve=curve,
            allowed_clients=allowed_clients,
            insecure=insecure,
            max_message_bytes=max_message_bytes,
        )

    def _handle(self, header: dict[str, Any], payload: list[memoryview]) -> tuple[dict, list]:
        op = expect(header, "op", str, where="header", field="op")
        no_payload(op, payload)
        if op == "info":
            info = {"length": self._length, "fingerprint": fingerprint(self.source),
                    "ordered": bool(getattr(self.source, "ordered", False)),
                    "source": source_state(self.source)}
            options = getattr(self.source, "collate_options", None)
            if callable(getattr(self.source, "bind_plan", None)) and callable(options):
                info["packed"] = options()  # rows per epoch vary: ask with op "epoch"
            return info, []
        if op not in ("batch", "epoch"):
            raise FormatError(
                f"unknown op {op!r}; expected info, batch or epoch", path="header", field="op"
            )
        args = {
            key: expect(header, key, kind, where="header", field=key)
            for key, kind in PLAN_KEYS.items()
        }
        if not 1 <= args["batch_size"] <= self.max_batch_size:
            raise ValueError(f"batch_size {args['batch_size']} outside [1, {self.max_batch_size}]")
        if not 0 <= args["rank"] < args["world_size"] <= _MAX_WORLD_SIZE:
            raise ValueError(
                f"rank {args['rank']} outside [0, world_size={args['world_size']}) or "
                f"world_size above {_MAX_WORLD_SIZE}"
            )
        plan, source = self._plan(args)
        consumed = args["consumed"]
        if op == "epoch":  # packed rows: the epoch's rows and the state's cursor at consumed
            rows = getattr(plan, "rows", None)
            if not callable(rows):
                raise ValueError("op 'epoch' is for sources with their own plan (packed rows)")
            if not 0 <= args["epoch"] < 1 << 63 or consumed < 0:
                raise ValueError(f"epoch={args['epoch']}, consumed={consumed}: out of range")
            return {"rows": rows(args["epoch"]),
                    "cursor": plan.cursor_state(args["epoch"], consumed)}, []
        # Any position with a step left: a state saved with another batch_size or
        # world_size (an elastic resume) continues mid-way through this plan's steps.
        if not 0 <= args["epoch"] < 1 << 63:
            raise ValueError(f"epoch={args['epoch']} outside [0, 2**63)")
        bounded = source is self.source and not callable(getattr(source, "bind_plan", None))
        if (consumed < 0 or (bounded and consumed >= plan.length)
                or not plan.has_step(consumed, args["epoch"])):
            raise ValueError(
                f"consumed={consumed} has no step left in the epoch ({plan.length} positions, "
                f"steps of {plan.step_size})"
            )
        batch = read_step(source, plan, args["epoch"], consumed, args["rank"])
        return {}, batch.to_frames()

    def _plan(self, args: dict[str, Any]) -> tuple[Any, Any]:
        """The plan for these arguments and the source it reads (a source with
        its own plan binds it: packed rows); the last few are kept."""
        from zerobatch.plan import Plan

        key = (
            args["batch_size"],
            args["world_size"],
            args["seed"],
            args["shuffle"],
            args["drop_last"],
            args["block_size"],
        )
        known = self._plans.get(key)
        if known is None:
            options = {"world_size": args["world_size"], "seed": args["seed"],
                       "shuffle": args["shuffle"], "drop_last": args["drop_last"],
                       "block_size": args["block_size"]}
            bind = getattr(self.source, "bind_plan", None)
            if callable(bind):
                known = bind(args["batch_size"], **options)
            else:
                known = (Plan(self._length, args["batch_size"], **options), self.source)
            self._plans[key] = known
            if len(self._plans) > _PLANS_KEPT:
                self._plans.popitem(last=False)
        self._plans.move_to_end(key)
        return known


def serve_dataset(
    path: str,
    address: str,
    *,
    seq_len: int | None = None,
    curve_keys: str | os.PathLike[str] | None = None,
    insecure: bool = False,
) -> None:
    """Serve a token-stream dataset (windows of ``seq_len`` tokens, else documents)
    until interrupted; what ``zerobatch serve`` runs.

    ``curve_keys`` is a secret key file written by ``zmq.auth.create_certificates``.
    Prints the bound address on stdout once listening.
    """
    from zerobatch.stream import Dataset, open_dataset

    dataset = open_dataset(path)
    if seq_len is not None:
        source: Any = dataset.windows(seq_len)
    elif isinstance(dataset, Dataset):
        source = dataset.documents()
    else:
        raise ValueError(f"{path}: a folder of .npy token files has no documents; pass --seq-len")
    curve = None
    if curve_keys is not None:
        import zmq.auth

        public, secret = zmq.auth.load_certificate(os.fspath(curve_keys))
        if secret is None:
            raise ValueError(f"{curve_keys}: not a secret key file (use the .key_secret file)")
        curve = CurveKeys(public, secret)
    server = BatchServer(source, address, curve=curve, insecure=insecure)
    print(f"serving {len(source)} observations of {path} on {server.address}", flush=True)
    server.serve()
