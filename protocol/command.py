"""RemotingCommand: the one message shape of the wire protocol (docs/PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trimq.protocol.codes import ResponseCode

FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2


@dataclass(slots=True)
class RemotingCommand:
    """A request, a oneway request or a response.

    ``opaque`` is chosen by the requester and echoed by the response, which lets responses go out of
    order on one connection. ``ext`` carries the header fields of this code (docs/PROTOCOL.md lists
    them); ``body`` is any msgpack value (``bytes`` for raw message records).
    """

    code: int
    opaque: int = 0
    flag: int = 0
    version: int = 0
    remark: str | None = None
    ext: dict[str, Any] = field(default_factory=dict)
    body: Any = None

    @classmethod
    def request(
        cls, code: int, ext: dict[str, Any] | None = None, body: Any = None, *, oneway: bool = False
    ) -> RemotingCommand:
        """A request; the transport fills in ``opaque`` when it sends it."""
        return cls(code=int(code), flag=FLAG_ONEWAY if oneway else 0, ext=ext or {}, body=body)

    @classmethod
    def response_to(
        cls,
        request: RemotingCommand,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext: dict[str, Any] | None = None,
        body: Any = None,
    ) -> RemotingCommand:
        """The response to ``request``: same opaque, response flag set."""
        return cls(
            code=int(code), opaque=request.opaque, flag=FLAG_RESPONSE, remark=remark, ext=ext or {}, body=body
        )

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @property
    def ok(self) -> bool:
        """True for a SUCCESS response."""
        return self.code == ResponseCode.SUCCESS

    def to_map(self) -> dict[str, Any]:
        """The msgpack map of this command; keys at their defaults are left out to keep frames small."""
        out: dict[str, Any] = {"code": self.code, "opaque": self.opaque}
        if self.flag:
            out["flag"] = self.flag
        if self.version:
            out["version"] = self.version
        if self.remark is not None:
            out["remark"] = self.remark
        if self.ext:
            out["ext"] = self.ext
        if self.body is not None:
            out["body"] = self.body
        return out
