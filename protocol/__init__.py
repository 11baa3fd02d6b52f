"""trimq's wire protocol and data formats, sans-IO: no trio, no sockets (docs/PROTOCOL.md, docs/STORAGE.md)."""

from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from trimq.protocol.errors import (
    EmptyFrameError,
    FieldTypeError,
    FrameTooLargeError,
    MalformedPayloadError,
    MissingFieldError,
    NotAMapError,
    ProtocolError,
    RecordError,
    UnencodableCommandError,
)
from trimq.protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from trimq.protocol.message import Message, MessageConst, MessageExt, decode_properties, encode_properties
from trimq.protocol.message_queue import MessageQueue

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "EmptyFrameError",
    "FieldTypeError",
    "FrameDecoder",
    "FrameTooLargeError",
    "MalformedPayloadError",
    "Message",
    "MessageConst",
    "MessageExt",
    "MessageQueue",
    "MissingFieldError",
    "NotAMapError",
    "ProtocolError",
    "RecordError",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "UnencodableCommandError",
    "decode_properties",
    "encode_frame",
    "encode_properties",
]
