"""Camera credentials stay inside the process: a source's identity in every output (JSON lines, events, logs, the
summary, reports) is a name the user gave (``NAME=rtsp://...``) or its URL with the user info replaced by ``***``;
the address it is opened at, credentials included, is only handed to the demuxer.

Credentials need not be typed in a URL (a shell history keeps it). For an ``rtsp://`` or ``rtsps://`` URL without
user info, the first of these that has them is used:

1. ``TRTC_RTSP_USER_<HOST>`` and ``TRTC_RTSP_PASSWORD_<HOST>``, HOST being the URL's host in capitals with every
   character other than a letter or a digit as ``_`` (``cam1.local`` -> ``TRTC_RTSP_PASSWORD_CAM1_LOCAL``,
   ``10.0.0.7`` -> ``TRTC_RTSP_PASSWORD_10_0_0_7``);
2. a ``machine HOST`` entry of the credentials file (``trtc run --credentials FILE``; the netrc format that curl
   and ftp read: ``machine cam1.local login admin password s3cret``, one entry per host);
3. ``TRTC_RTSP_USER`` and ``TRTC_RTSP_PASSWORD`` (every host);
4. the credentials file's ``default`` entry.

A password without a user name is refused (RTSP's basic and digest authentication take both).
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote, unquote, urlsplit

from ..errors import UsageProblem

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s'\"]*@")  # to the last @ before the path
_NAME = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.\-]*)=([A-Za-z][A-Za-z0-9+.\-]*://.*)", re.S)
CREDENTIAL_SCHEMES = ("rtsp", "rtsps")


def redact(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***`` (``rtsp://***@host/path``)."""
    return _USERINFO.sub(r"\1***@", str(text))


class Address(str):
    """A source as every output names it (``str(self)``: the name the user gave, or the URL without its user info),
    carrying the address it is opened at (``url``: user info included), which no output shows."""

    url: str

    def __new__(cls, name: str, url: str):
        self = super().__new__(cls, name)
        self.url = url
        return self

    def __reduce__(self):  # a worker process of this run opens the source too
        return (Address, (str(self), self.url))

    def secrets(self) -> list[str]:
        info = urlsplit(self.url)
        found = [s for s in (info.password, info.username) if s]
        return found + [unquote(s) for s in found if unquote(s) != s]

    def scrub(self, text: str) -> str:
        """``text`` (an FFmpeg message naming the URL it was given) with the address as its name, and no user info
        or password left in it."""
        text = str(text).replace(self.url, str(self))
        text = redact(text)
        for secret in sorted(self.secrets(), key=len, reverse=True):
            if len(secret) >= 3:  # a one-letter user name would blot out the text for nothing
                text = text.replace(secret, "***")
        return text


def url_of(source) -> str:
    """The address ``source`` is opened at (for an :class:`Address`, with its credentials)."""
    return getattr(source, "url", source)


def scrub(source, text: str) -> str:
    """``text`` fit for an output about ``source``: no user info, no password of its address."""
    return source.scrub(text) if isinstance(source, Address) else redact(text)


def env_name(host: str) -> str:
    """The per-host suffix of TRTC_RTSP_USER_/TRTC_RTSP_PASSWORD_ for ``host``."""
    return re.sub(r"[^A-Z0-9]", "_", host.upper())


def read_credentials(path) -> dict:
    """{host: (user, password)} from a netrc-format file, the ``default`` entry under None. A file that cannot be
    read or parsed is a UsageProblem; its lines are never quoted (they hold passwords)."""
    import netrc

    try:
        parsed = netrc.netrc(os.fspath(path))
    except FileNotFoundError:
        raise UsageProblem(f"credentials file {path} not found", "give a netrc-format file: one line "
                           "'machine HOST login USER password PASSWORD' per camera host") from None
    except (netrc.NetrcParseError, OSError, UnicodeDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        raise UsageProblem(f"credentials file {path} cannot be read as netrc{f' (line {line})' if line else ''}",
                           "one line 'machine HOST login USER password PASSWORD' per camera host") from None
    out = {}
    for host, (login, _account, password) in parsed.hosts.items():
        out[None if host == "default" else host.lower()] = (login or "", password or "")
    return out


def _from_env(env, suffix: str = ""):
    user, password = env.get(f"TRTC_RTSP_USER{suffix}"), env.get(f"TRTC_RTSP_PASSWORD{suffix}")
    if password and not user:
        raise UsageProblem(f"TRTC_RTSP_PASSWORD{suffix} is set without TRTC_RTSP_USER{suffix}",
                           f"set TRTC_RTSP_USER{suffix} too (RTSP authentication takes a user name and a password)")
    return (user, password or "") if user else None


def lookup(host: str, credentials: dict | None, env) -> tuple[str, str] | None:
    """(user, password) for ``host``, in the order of this module's docstring, or None."""
    credentials = credentials or {}
    for found in (_from_env(env, "_" + env_name(host)), credentials.get(host.lower()), _from_env(env),
                  credentials.get(None)):
        if found and found[0]:
            return found
    return None


def source_address(text: str, credentials: dict | None = None, env=None):
    """The source ``text`` as the run knows it: a plain ``str`` where nothing is to be hidden or named, else an
    :class:`Address` (``NAME=URL`` names a URL; a URL's user info is hidden; credentials from the environment or
    the credentials file are added to an RTSP URL without user info)."""
    text = os.fspath(text)
    env = os.environ if env is None else env
    m = _NAME.fullmatch(text)
    name, url = (m.group(1), m.group(2)) if m else (None, text)
    parts = urlsplit(url) if "://" in url else None
    if parts is None:
        return text
    shown = redact(url)
    if parts.username is None and parts.scheme.lower() in CREDENTIAL_SCHEMES and parts.hostname:
        found = lookup(parts.hostname, credentials, env)
        if found:
            user, password = (quote(s, safe="") for s in found)
            url = f"{parts.scheme}://{user}{':' + password if password else ''}@{parts.netloc}" + \
                url[len(parts.scheme) + 3 + len(parts.netloc):]
    name = name or shown
    return text if (name == url and m is None) else Address(name, url)


def has_credentials(source) -> bool:
    """Whether ``source``'s address carries a user name (given in the URL or found for its host)."""
    try:
        return urlsplit(url_of(source)).username is not None
    except ValueError:
        return False
