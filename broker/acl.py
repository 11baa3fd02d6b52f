"""Access control: RocketMQ's plain ACL (accounts, PUB/SUB/DENY rights, HMAC request signatures) in TOML.

Pure: no trio, no I/O except ``load_acl`` reading the file. docs/SECURITY.md is the user-facing reference
(file format, the signature's canonical bytes, the permission table); this module is its implementation.

How a request is checked (``AccessValidator.check``), in RocketMQ's order (PlainAccessValidator.validate):

1. Name-server codes are never checked (RocketMQ's name server has no ACL).
2. A remote address on the global whitelist is let through without credentials.
3. ``AccessKey`` must name an account and ``Signature`` must be the HMAC-SHA1 (base64) of the request's
   canonical bytes under that account's secret key.
4. Admin-only codes need an admin account; every (topic or group, permission) pair the code needs
   (``required_permissions``) must be granted by the account's explicit entry or its default.

Groups are resources of their own; a ``%RETRY%<group>`` topic is the group's resource, as in RocketMQ.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trimq.protocol.address import parse_address
from trimq.protocol.codes import RequestCode, code_name
from trimq.protocol.command import RemotingCommand
from trimq.protocol.signature import (
    ACCESS_KEY,
    SIGNATURE,
    calc_signature,
    canonical_content,
    canonical_value,
    sign_command,
)
from trimq.protocol.validation import RETRY_GROUP_TOPIC_PREFIX
from trimq.runtime.settings import ConfigError

# RocketMQ's Permission bits.
DENY = 1
ANY = 2
PUB = 4
SUB = 8

MIN_KEY_LENGTH = 7  # RocketMQ: "length should longer than 6"

ResourceKind = Literal["topic", "group"]


class AclError(ConfigError):
    """The ACL file is invalid; the message names the file, the account and the field."""


class AclDenied(Exception):
    """A request is refused; ``str(exc)`` is the NO_PERMISSION remark sent back."""


# ------------------------------------------------------------------------------------------------
# Permissions

_PERM_NAMES = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}


def parse_perm(text: object) -> int:
    """``"PUB"``, ``"SUB"``, ``"PUB|SUB"`` (or ``"SUB|PUB"``) or ``"DENY"`` → bits. ValueError otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"permission must be a string, got {type(text).__name__}")
    norm = text.replace(" ", "").upper()
    if norm not in _PERM_NAMES:
        raise ValueError(f"permission {text!r} is not one of DENY, PUB, SUB, PUB|SUB")
    return _PERM_NAMES[norm]


def perm_text(perm: int) -> str:
    """Readable name of permission bits (for remarks)."""
    if perm & DENY:
        return "DENY"
    names = [n for n, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit]
    if perm & ANY:
        names.append("ANY")
    return "|".join(names) or "none"


def check_permission(needed: int, owned: int) -> bool:
    """RocketMQ's Permission.checkPermission: DENY wins; ANY is met by PUB or SUB; else any needed bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def resource_of_topic(topic: str) -> tuple[ResourceKind, str]:
    """The resource a topic name stands for: ``%RETRY%g`` is group ``g``, anything else the topic itself."""
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return "group", topic[len(RETRY_GROUP_TOPIC_PREFIX):]
    return "topic", topic


# ------------------------------------------------------------------------------------------------
# The ACL file


@dataclass(frozen=True)
class Account:
    """One access key with its rights (RocketMQ's PlainAccessConfig)."""

    access_key: str
    secret_key: str = field(repr=False)
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: Mapping[str, int] = field(default_factory=dict)
    group_perms: Mapping[str, int] = field(default_factory=dict)

    def owned_perm(self, kind: ResourceKind, name: str) -> int:
        """The account's permission on a topic or group: its explicit entry, else its default."""
        if kind == "group":
            return self.group_perms.get(name, self.default_group_perm)
        return self.topic_perms.get(name, self.default_topic_perm)


class AddressPattern:
    """One whitelist entry: ``*``, an IP, a CIDR network, or IPv4 with per-octet ``*``, ``a-b``, ``{a,b}``."""

    _OCTET = re.compile(r"^(\*|\d{1,3}|\d{1,3}-\d{1,3}|\{\d{1,3}(,\d{1,3})*\})$")

    def __init__(self, text: str) -> None:
        self.text = text
        self._network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
        self._octets: list[Callable[[int], bool]] | None = None
        t = text.strip()
        if t in ("*", "*.*.*.*"):
            self._octets = [lambda _o: True] * 4
            return
        try:
            self._network = ipaddress.ip_network(t, strict=False)
            return
        except ValueError:
            pass
        parts = t.split(".")
        if len(parts) != 4 or not all(self._OCTET.match(p) for p in parts):
            raise ValueError(
                f"address pattern {text!r} is not *, an IP address, a CIDR network or an IPv4 pattern "
                "such as 192.168.1.*, 192.168.1.1-20 or 192.168.1.{1,5}"
            )
        self._octets = [self._octet_matcher(p, text) for p in parts]

    @staticmethod
    def _octet_matcher(part: str, text: str) -> Callable[[int], bool]:
        if part == "*":
            return lambda _o: True
        if part.startswith("{"):
            values = {int(v) for v in part[1:-1].split(",")}
            if max(values) > 255:
                raise ValueError(f"address pattern {text!r}: octet {part!r} is above 255")
            return values.__contains__
        lo_s, _, hi_s = part.partition("-")
        lo, hi = int(lo_s), int(hi_s or lo_s)
        if hi > 255 or lo > hi:
            raise ValueError(f"address pattern {text!r}: octet range {part!r} is not within 0-255")
        return lambda o: lo <= o <= hi

    def match(self, ip: str) -> bool:
        """True when ``ip`` (an address string, IPv4-mapped IPv6 allowed) is covered by this pattern."""
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if self._network is not None:
            return addr.version == self._network.version and addr in self._network
        if self._octets is None or addr.version != 4:
            return False
        return all(m(o) for m, o in zip(self._octets, addr.packed, strict=True))

    def __repr__(self) -> str:
        return f"AddressPattern({self.text!r})"


@dataclass(frozen=True)
class AclConfig:
    """A parsed ACL file."""

    accounts: Mapping[str, Account]
    global_white_remote_addresses: tuple[AddressPattern, ...] = ()

    def whitelisted(self, ip: str | None) -> bool:
        return ip is not None and any(p.match(ip) for p in self.global_white_remote_addresses)


_ACCOUNT_KEYS = {"access_key", "secret_key", "admin", "default_topic_perm", "default_group_perm", "topic_perms",
                 "group_perms"}
_TOP_KEYS = {"accounts", "global_white_remote_addresses"}


def parse_acl(data: Mapping[str, Any], source: str = "acl") -> AclConfig:
    """Validate a decoded ACL document (the TOML's tables). Raises AclError naming account and field."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise AclError(f"{source}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(_TOP_KEYS))})")
    white = data.get("global_white_remote_addresses", [])
    if not isinstance(white, list) or not all(isinstance(w, str) for w in white):
        raise AclError(f"{source}: global_white_remote_addresses must be a list of strings")
    patterns = []
    for w in white:
        try:
            patterns.append(AddressPattern(w))
        except ValueError as exc:
            raise AclError(f"{source}: global_white_remote_addresses: {exc}") from None
    raw_accounts = data.get("accounts", [])
    if not isinstance(raw_accounts, list) or not all(isinstance(a, dict) for a in raw_accounts):
        raise AclError(f"{source}: accounts must be an array of tables ([[accounts]])")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        acc = _parse_account(raw, f"{source}: accounts[{i}]")
        if acc.access_key in accounts:
            raise AclError(f"{source}: accounts[{i}] (access_key {acc.access_key!r}): access_key is used twice")
        accounts[acc.access_key] = acc
    if not accounts and not patterns:
        raise AclError(f"{source}: no accounts and no whitelisted addresses: every request would be refused")
    return AclConfig(accounts=accounts, global_white_remote_addresses=tuple(patterns))


def _parse_account(raw: Mapping[str, Any], where: str) -> Account:
    ak = raw.get("access_key")
    if isinstance(ak, str):
        where = f"{where} (access_key {ak!r})"
    unknown = set(raw) - _ACCOUNT_KEYS
    if unknown:
        raise AclError(f"{where}: unknown field {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(_ACCOUNT_KEYS))})")
    for key in ("access_key", "secret_key"):
        v = raw.get(key)
        if not isinstance(v, str):
            raise AclError(f"{where}: {key} is missing or not a string")
        if len(v) < MIN_KEY_LENGTH:
            raise AclError(f"{where}: {key} must be at least {MIN_KEY_LENGTH} characters")
        if not v.isprintable() or v != v.strip():
            raise AclError(f"{where}: {key} must be printable, without surrounding spaces")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise AclError(f"{where}: admin must be true or false")

    def perm(key: str, value: object) -> int:
        try:
            return parse_perm(value)
        except ValueError as exc:
            raise AclError(f"{where}: {key}: {exc}") from None

    def perm_table(key: str) -> dict[str, int]:
        table = raw.get(key, {})
        if not isinstance(table, dict):
            raise AclError(f"{where}: {key} must be a table of name = \"PERM\"")
        out = {}
        for name, value in table.items():
            if not name:
                raise AclError(f"{where}: {key} has an empty name")
            if key == "topic_perms" and name.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise AclError(f"{where}: {key}.{name}: a retry topic is its group's resource; "
                               f"set group_perms.{name[len(RETRY_GROUP_TOPIC_PREFIX):]} instead")
            out[name] = perm(f"{key}.{name}", value)
        return out

    return Account(
        access_key=raw["access_key"],
        secret_key=raw["secret_key"],
        admin=admin,
        default_topic_perm=perm("default_topic_perm", raw.get("default_topic_perm", "DENY")),
        default_group_perm=perm("default_group_perm", raw.get("default_group_perm", "DENY")),
        topic_perms=perm_table("topic_perms"),
        group_perms=perm_table("group_perms"),
    )


def load_acl(path: str) -> AclConfig:
    """Read and validate an ACL TOML file. Raises AclError (a ConfigError) for any problem."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise AclError(f"acl file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AclError(f"acl file {path} is not valid TOML: {exc}") from None
    return parse_acl(data, f"acl file {path}")


# ------------------------------------------------------------------------------------------------
# Signatures



# ------------------------------------------------------------------------------------------------
# Which permissions each request code needs


@dataclass(frozen=True)
class Requirement:
    """What a request needs: nothing (``exempt``), an admin account, and/or rights on resources."""

    exempt: bool = False
    admin: bool = False
    needs: tuple[tuple[ResourceKind, str, int], ...] = ()


@dataclass(frozen=True)
class _Rule:
    admin: bool = False
    topic_perm: int = 0  # needed on every topic the request names
    group_perm: int = 0  # needed on every group the request names
    topics: Callable[[Mapping[str, Any], Any], list[str]] = lambda ext, body: []
    groups: Callable[[Mapping[str, Any], Any], list[str]] = lambda ext, body: []


def _ext(name: str, *, required: bool = True) -> Callable[[Mapping[str, Any], Any], list[str]]:
    def get(ext: Mapping[str, Any], body: Any) -> list[str]:
        v = ext.get(name)
        if v is None and not required:
            return []
        if not isinstance(v, str) or not v:
            raise AclDenied(f"ext field {name!r} is missing or not a non-empty string; it is needed for the "
                            "permission check")
        return [v]

    return get


def _body_map(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise AclDenied(f"{what} body must be a map for the permission check")
    return body


def _heartbeat_groups(ext: Mapping[str, Any], body: Any) -> list[str]:
    out = []
    for data in _heartbeat_consumers(body):
        g = data.get("groupName")
        if not isinstance(g, str) or not g:
            raise AclDenied("HEART_BEAT consumerDataSet[].groupName must be a non-empty string")
        out.append(g)
    return out


def _heartbeat_topics(ext: Mapping[str, Any], body: Any) -> list[str]:
    out = []
    for data in _heartbeat_consumers(body):
        subs = data.get("subscriptionDataSet") or []
        if not isinstance(subs, list):
            raise AclDenied("HEART_BEAT subscriptionDataSet must be an array")
        for sub in subs:
            t = sub.get("topic") if isinstance(sub, dict) else None
            if not isinstance(t, str) or not t:
                raise AclDenied("HEART_BEAT subscriptionDataSet[].topic must be a non-empty string")
            out.append(t)
    return out


def _heartbeat_consumers(body: Any) -> list[dict[str, Any]]:
    consumers = _body_map(body, "HEART_BEAT").get("consumerDataSet") or []
    if not isinstance(consumers, list) or not all(isinstance(c, dict) for c in consumers):
        raise AclDenied("HEART_BEAT consumerDataSet must be an array of maps")
    return consumers


def _lock_group(ext: Mapping[str, Any], body: Any) -> list[str]:
    g = _body_map(body, "LOCK/UNLOCK_BATCH_MQ").get("consumerGroup")
    if not isinstance(g, str) or not g:
        raise AclDenied("body field 'consumerGroup' is missing or not a non-empty string")
    return [g]


def _lock_topics(ext: Mapping[str, Any], body: Any) -> list[str]:
    mqs = _body_map(body, "LOCK/UNLOCK_BATCH_MQ").get("mqSet") or []
    if not isinstance(mqs, list):
        raise AclDenied("body field 'mqSet' must be an array")
    out = []
    for mq in mqs:
        t = mq.get("topic") if isinstance(mq, dict) else None
        if not isinstance(t, str) or not t:
            raise AclDenied("body field 'mqSet[].topic' must be a non-empty string")
        out.append(t)
    return out


_NAMESRV_CODES = frozenset({
    RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER, RequestCode.GET_ROUTEINFO_BY_TOPIC,
    RequestCode.GET_BROKER_CLUSTER_INFO, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
})
_ADMIN = _Rule(admin=True)
_AUTHENTICATED = _Rule()
_TOPIC = _ext("topic")

# RocketMQ 4.9.3 PlainAccessValidator.parse() plus Permission.ADMIN_CODE, extended to trimq's codes.
# A code missing here needs a valid signature and nothing else.
RULES: dict[int, _Rule] = {
    RequestCode.SEND_MESSAGE: _Rule(topic_perm=PUB, topics=_TOPIC),
    RequestCode.SEND_MESSAGE_V2: _Rule(topic_perm=PUB, topics=_TOPIC),
    RequestCode.SEND_BATCH_MESSAGE: _Rule(topic_perm=PUB, topics=_TOPIC),
    RequestCode.PULL_MESSAGE: _Rule(topic_perm=SUB, group_perm=SUB, topics=_TOPIC, groups=_ext("consumerGroup")),
    RequestCode.QUERY_MESSAGE: _Rule(topic_perm=SUB, topics=_TOPIC),
    RequestCode.QUERY_CONSUMER_OFFSET: _Rule(topic_perm=SUB, group_perm=SUB, topics=_TOPIC,
                                             groups=_ext("consumerGroup")),
    RequestCode.UPDATE_CONSUMER_OFFSET: _Rule(topic_perm=SUB, group_perm=SUB, topics=_TOPIC,
                                              groups=_ext("consumerGroup")),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _Rule(topic_perm=ANY, topics=_TOPIC),
    RequestCode.GET_MAX_OFFSET: _Rule(topic_perm=ANY, topics=_TOPIC),
    RequestCode.GET_MIN_OFFSET: _Rule(topic_perm=ANY, topics=_TOPIC),
    RequestCode.GET_EARLIEST_MSG_STORETIME: _Rule(topic_perm=ANY, topics=_TOPIC),
    RequestCode.HEART_BEAT: _Rule(topic_perm=SUB, group_perm=SUB, topics=_heartbeat_topics, groups=_heartbeat_groups),
    RequestCode.UNREGISTER_CLIENT: _Rule(group_perm=SUB, groups=_ext("consumerGroup", required=False)),
    RequestCode.CONSUMER_SEND_MSG_BACK: _Rule(topic_perm=PUB, group_perm=SUB,
                                              topics=_ext("originTopic", required=False), groups=_ext("group")),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _Rule(group_perm=SUB, groups=_ext("consumerGroup")),
    RequestCode.LOCK_BATCH_MQ: _Rule(topic_perm=SUB, group_perm=SUB, topics=_lock_topics, groups=_lock_group),
    RequestCode.UNLOCK_BATCH_MQ: _Rule(topic_perm=SUB, group_perm=SUB, topics=_lock_topics, groups=_lock_group),
    # Group and topic views: what a member of the group (or a reader of the topic) may see.
    RequestCode.GET_CONSUMER_RUNNING_INFO: _Rule(group_perm=SUB, groups=_ext("consumerGroup")),
    RequestCode.GET_CONSUMER_CONNECTION_LIST: _Rule(group_perm=SUB, groups=_ext("consumerGroup")),
    RequestCode.GET_CONSUME_STATS: _Rule(group_perm=SUB, groups=_ext("consumerGroup")),
    RequestCode.GET_TOPIC_STATS_INFO: _Rule(topic_perm=ANY, topics=_TOPIC),
    # Admin only: RocketMQ's ADMIN_CODE set, offset resets, trimq's 9000+ operations, and reading a message by
    # commit-log offset (its topic is unknown until it is read, so topic rights cannot be checked).
    RequestCode.UPDATE_AND_CREATE_TOPIC: _ADMIN,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: _ADMIN,
    RequestCode.RESET_CONSUMER_CLIENT_OFFSET: _ADMIN,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: _ADMIN,
    RequestCode.VIEW_MESSAGE_BY_ID: _ADMIN,
    RequestCode.GET_LOCK_TABLE: _ADMIN,
    RequestCode.QUERY_DLQ_MESSAGES: _ADMIN,
    RequestCode.RESEND_DLQ_MESSAGES: _ADMIN,
    RequestCode.SKIP_MESSAGE: _ADMIN,
    RequestCode.GET_SUBSCRIPTION_CONSISTENCY: _ADMIN,
    # Deletions (issue 19): RocketMQ's ADMIN_CODE has the broker's two; the name server's too when it is
    # embedded in a broker with an ACL.
    RequestCode.DELETE_TOPIC_IN_BROKER: _ADMIN,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: _ADMIN,
    RequestCode.DELETE_TOPIC_IN_NAMESRV: _ADMIN,
}


def required_permissions(code: int, ext: Mapping[str, Any], body: Any) -> Requirement:
    """What request ``code`` with these fields needs. Raises AclDenied when a field it needs is unreadable."""
    if code in _NAMESRV_CODES:
        return Requirement(exempt=True)
    rule = RULES.get(code, _AUTHENTICATED)
    needs: list[tuple[ResourceKind, str, int]] = []
    if rule.topic_perm:
        for t in rule.topics(ext, body):
            kind, name = resource_of_topic(t)
            needs.append((kind, name, rule.topic_perm))
    if rule.group_perm:
        needs.extend(("group", g, rule.group_perm) for g in rule.groups(ext, body))
    return Requirement(admin=rule.admin, needs=tuple(dict.fromkeys(needs)))


def missing_permission(account: Account, code: int, requirement: Requirement) -> str | None:
    """Why ``account`` may not make this request (a NO_PERMISSION remark), or None when it may."""
    if requirement.exempt:
        return None
    if requirement.admin and not account.admin:
        return (f"request code {code} ({code_name(code, response=False)}) needs an admin account; "
                f"AccessKey={account.access_key} is not one")
    if account.admin and not account.topic_perms and not account.group_perms:
        return None  # RocketMQ: an admin without explicit entries may access every resource
    for kind, name, needed in requirement.needs:
        owned = account.owned_perm(kind, name)
        if not check_permission(needed, owned):
            return (f"AccessKey={account.access_key} has no {perm_text(needed)} permission on {kind} {name!r} "
                    f"(it has {perm_text(owned)})")
    return None


class AccessValidator:
    """Checks requests against an AclConfig. Counts what it decided (``accepted``, ``denied``)."""

    def __init__(self, config: AclConfig) -> None:
        self.config = config
        self.accepted = 0
        self.denied = 0

    def authenticate(self, cmd: RemotingCommand) -> Account:
        """The account whose valid signature ``cmd`` carries. Raises AclDenied saying what is wrong."""
        ext = cmd.ext
        ak = ext.get(ACCESS_KEY)
        if ak is None:
            raise AclDenied("no AccessKey: this broker requires signed requests (ACL is enabled)")
        if not isinstance(ak, str):
            raise AclDenied("AccessKey must be a string")
        account = self.config.accounts.get(ak)
        if account is None:
            raise AclDenied(f"no account with AccessKey={ak}")
        sig = ext.get(SIGNATURE)
        if not isinstance(sig, str):
            raise AclDenied(f"no Signature (AccessKey={ak})")
        expected = calc_signature(cmd.code, ext, cmd.body, account.secret_key)
        if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace")):
            raise AclDenied(f"signature check failed for AccessKey={ak}")
        return account

    def authorize(self, account: Account, code: int, topic: str | None = None, group: str | None = None) -> bool:
        """May ``account`` make request ``code`` on ``topic`` / ``group`` (the table's simple form)?"""
        if code in _NAMESRV_CODES:
            return True
        rule = RULES.get(code, _AUTHENTICATED)
        needs: list[tuple[ResourceKind, str, int]] = []
        if rule.topic_perm and topic:
            needs.append((*resource_of_topic(topic), rule.topic_perm))
        if rule.group_perm and group:
            needs.append(("group", group, rule.group_perm))
        return missing_permission(account, code, Requirement(admin=rule.admin, needs=tuple(needs))) is None

    def check(self, cmd: RemotingCommand, remote: str | None = None) -> str | None:
        """The whole check for a request from ``remote`` (``host:port``): a NO_PERMISSION remark or None."""
        try:
            remark = self._check(cmd, remote)
        except AclDenied as exc:
            remark = str(exc)
        except (ValueError, TypeError, OverflowError) as exc:
            # e.g. a body nested deeper than msgpack re-encodes: it cannot be verified, so it is refused
            remark = f"request cannot be checked: {type(exc).__name__}: {exc}"
        if remark is None:
            self.accepted += 1
        else:
            self.denied += 1
        return remark

    def _check(self, cmd: RemotingCommand, remote: str | None) -> str | None:
        if cmd.code in _NAMESRV_CODES:
            return None
        if self.config.global_white_remote_addresses and remote:
            try:
                ip: str | None = parse_address(remote)[0]
            except ValueError:
                ip = None
            if self.config.whitelisted(ip):
                return None
        account = self.authenticate(cmd)
        return missing_permission(account, cmd.code, required_permissions(cmd.code, cmd.ext, cmd.body))


__all__ = [
    "ACCESS_KEY",
    "ANY",
    "DENY",
    "PUB",
    "RULES",
    "SIGNATURE",
    "SUB",
    "AccessValidator",
    "Account",
    "AclConfig",
    "AclDenied",
    "AclError",
    "AddressPattern",
    "Requirement",
    "calc_signature",
    "canonical_content",
    "canonical_value",
    "check_permission",
    "load_acl",
    "missing_permission",
    "parse_acl",
    "parse_perm",
    "perm_text",
    "required_permissions",
    "resource_of_topic",
    "sign_command",
]
