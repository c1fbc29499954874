"""Where a table lives: URIs, object-store options and file systems, decided in one place.

Every module of :mod:`splitkeeper.delta` and the Delta sink reach storage through
these functions; nothing else parses a location or reads a credential.

Contract:

1. A location is a local path (relative ones are made absolute, ``~`` is expanded), a
   ``file:`` URI or an object-store URI. A ``file:`` URI is percent-decoded (delta-rs
   reports ``file:///st%20ate/`` for ``/st ate``): a local path is always the path as
   the file system spells it, spaces and non-ASCII characters included; a plain path
   is never decoded (``%20`` in it is three characters). ``s3a://`` (the Hadoop/Spark
   scheme the configs use) is the same bucket and key as ``s3://``; :func:`table_uri` maps it for delta-rs and
   pyarrow, :func:`spark_uri` maps it back for Spark readers. No other module
   rewrites a scheme.
2. :func:`storage_options` is what delta-rs gets for a URI: nothing for local
   paths; for S3, the standard variables ``AWS_ENDPOINT_URL`` (or
   ``SPLITKEEPER_S3A_ENDPOINT``, what docker-compose sets for Spark),
   ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
   ``AWS_REGION`` (default ``us-east-1`` with a custom endpoint) and
   ``AWS_ALLOW_HTTP`` (default true for an ``http://`` endpoint), plus the commit
   protocol below. Values are never logged.
3. Safe concurrent commits on S3: delta-rs 1.x commits a log entry with a
   conditional put (``If-None-Match: *`` on ``_delta_log/<version>.json``), which
   AWS S3 (since 2024), MinIO and R2 honour, so two writers of the same version
   cannot both succeed and the fence (:mod:`splitkeeper.delta.fence`) holds. The
   options say so explicitly: ``aws_conditional_put=etag`` (delta-rs's documented
   setting for S3-compatible stores) and ``AWS_S3_ALLOW_UNSAFE_RENAME=false``, so a
   stray environment variable cannot switch the store to unsafe, unconditional
   commits. delta-rs 1.x has no DynamoDB lock; none is configured. Whether the store
   honours the header is checked before a pipeline writes (:mod:`~splitkeeper.delta.probe`).
4. Transient store errors (HTTP 5xx such as 503 SlowDown, a reset connection, a timeout) are
   retried by the storage clients, with backoff: delta-rs (object_store) up to
   :data:`MAX_RETRIES` times within :data:`RETRY_TIMEOUT` (the options ``max_retries`` and
   ``retry_timeout``, pinned here rather than left to the library's defaults), pyarrow with
   the AWS standard retry strategy up to :data:`MAX_RETRIES` attempts. A conditional put (a
   Delta commit) whose answer was lost may land or not. When object_store sends it again and
   the first one had landed, the store refuses the copy (412) and delta-rs commits the same
   actions again at the next version: for a fenced commit its app transaction makes that a
   conflict, which the fence reads as this attempt's own commit (:mod:`~splitkeeper.delta.fence`
   step 4); a blind append (``StateTables.append``) can then land twice. When the commit
   raises instead, the fence re-reads the table (step 5) and a table's create reads it again
   (:func:`~splitkeeper.delta.tables.ensure_table`). ``chaos --store s3`` runs the pipeline
   through a proxy that injects these faults; splitkeeper's own retries are counted
   (:mod:`~splitkeeper.delta.retries`).
5. :func:`sigv4_authorization` signs one S3 request (AWS Signature Version 4) for the few
   requests delta-rs and pyarrow cannot make: the store probe's conditional puts
   (:mod:`~splitkeeper.delta.probe`) and the file source's one-GET content sample of an object
   named by a bucket event (:mod:`splitkeeper.sources.files.fs`, whose ``pyarrow`` open costs a
   HEAD before its GET).
6. :func:`filesystem` gives a ``pyarrow.fs`` file system and the path inside it, for
   the sink's file moves, the log diagnosis and the file source on an object store; for S3 it
   uses the same options. ``gs://bucket/path`` is a ``GcsFileSystem``: with
   ``STORAGE_EMULATOR_HOST`` (the google client libraries' emulator variable; google-cloud-cpp,
   under pyarrow, names it ``CLOUD_STORAGE_EMULATOR_ENDPOINT``, read too) set to ``http://host:port``
   it talks to that endpoint with no credentials, as those libraries do; otherwise Google's default
   credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server). ``GOOGLE_CLOUD_PROJECT``
   is its project. It gives up on a request after :data:`GCS_RETRY_S` seconds of retries (a check,
   ``attempts`` below :data:`MAX_RETRIES`: :data:`GCS_CHECK_RETRY_S`). ``abfss://container@account
   .dfs.core.windows.net/path`` is an ``AzureFileSystem`` of that account (``abfss://container/path``:
   the account of ``AZURE_STORAGE_ACCOUNT_NAME``) with the variables delta-rs (object_store) reads
   for Azure: ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN`` (neither: Azure's default
   credential chain, ``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/``AZURE_CLIENT_SECRET``, a managed
   identity), and ``AZURE_STORAGE_USE_EMULATOR=true`` for Azurite at ``AZURITE_BLOB_STORAGE_URL``
   (default ``http://127.0.0.1:10000``; its well-known development key when no key is set).
   :data:`FILESYSTEM_ENV` lists every variable read here.

Pure functions of their arguments and the environment; safe from any thread.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from splitkeeper.errors import InvalidParameterError

__all__ = [
    "FILESYSTEM_ENV",
    "delta_location",
    "filesystem",
    "is_local",
    "join",
    "local_path",
    "sigv4_authorization",
    "signed_headers",
    "signed_request",
    "spark_uri",
    "storage_options",
    "table_uri",
]

_S3_SCHEMES = ("s3://", "s3a://", "s3n://")

#: Environment variables passed to delta-rs for S3 (``name -> option key``).
_S3_ENV = {
    "AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN": "AWS_SESSION_TOKEN",
    "AWS_REGION": "AWS_REGION",
    "AWS_ALLOW_HTTP": "AWS_ALLOW_HTTP",
}
#: Retries of a transient store error (rule 4), by delta-rs and by pyarrow.
MAX_RETRIES = 10
RETRY_TIMEOUT = "120s"
#: The endpoint docker-compose gives Spark (``fs.s3a.endpoint``), used when AWS_ENDPOINT_URL is unset.
_SPARK_ENDPOINT_ENV = "SPLITKEEPER_S3A_ENDPOINT"
#: gs:// (rule 6): the emulator's endpoint, by the google client libraries' names (first set wins).
GCS_EMULATOR_ENV = ("STORAGE_EMULATOR_HOST", "CLOUD_STORAGE_EMULATOR_ENDPOINT")
GCS_PROJECT_ENV = "GOOGLE_CLOUD_PROJECT"
#: Seconds a GCS request is retried for (a transient error), and for a check (rule 6).
GCS_RETRY_S = 120.0
GCS_CHECK_RETRY_S = 2.0
#: abfss:// (rule 6): object_store's (delta-rs's) names for an Azure account and Azurite.
AZURE_ENV = (
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURITE_BLOB_STORAGE_URL",
)
AZURITE_URL = "http://127.0.0.1:10000"
#: Azurite's development account and key, as Microsoft documents them (public, emulator only).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
#: Every variable :func:`filesystem` reads (a cache of file systems is keyed by their values).
FILESYSTEM_ENV = (*_S3_ENV, _SPARK_ENDPOINT_ENV, *GCS_EMULATOR_ENV, GCS_PROJECT_ENV, *AZURE_ENV)


def table_uri(location: str | os.PathLike[str]) -> str:
    """The URI delta-rs and pyarrow get for ``location`` (rule 1): absolute path, or ``s3://...``."""
    text = os.fspath(location).strip()
    if not text:
        raise InvalidParameterError("location", text, "a directory path or a URI")
    for scheme in _S3_SCHEMES:
        if text.startswith(scheme):
            return "s3://" + text[len(scheme) :].rstrip("/")
    local = local_path(text)
    if local is not None:
        return os.path.abspath(os.path.expanduser(local))
    return text.rstrip("/")


def delta_location(reported: str) -> str:
    """The location of a table as delta-rs reports it (``DeltaTable.table_uri``: a URL, its path
    percent-encoded) as this module spells locations (rule 1): ``file:///st%20ate/`` is
    ``/st ate``, ``s3://b/%C3%A9tat/`` is ``s3://b/état``. Only for what delta-rs reports:
    a location a user wrote is never decoded."""
    if reported.startswith(_S3_SCHEMES):
        return table_uri(unquote(reported))
    return table_uri(reported)


def spark_uri(location: str | os.PathLike[str]) -> str:
    """``location`` as Spark's Hadoop file systems read it (``s3://`` becomes ``s3a://``)."""
    uri = table_uri(location)
    return "s3a://" + uri[len("s3://") :] if uri.startswith("s3://") else uri


def local_path(location: str) -> str | None:
    """``location`` as a local path when it is one (no scheme, or ``file:``, decoded), else None."""
    if location.startswith("file://"):
        return unquote(location[len("file://") :])
    if location.startswith("file:"):
        return unquote(location[len("file:") :])
    return None if "://" in location else location


def is_local(location: str | os.PathLike[str]) -> bool:
    return local_path(os.fspath(location)) is not None


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for paths and URIs alike."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def storage_options(
    location: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """The delta-rs storage options for ``location`` (rules 2 and 3); None for a local table."""
    uri = table_uri(location)
    if not uri.startswith("s3://"):
        return None
    environ = os.environ if env is None else env
    options = {key: environ[name] for name, key in _S3_ENV.items() if environ.get(name)}
    endpoint = options.get("AWS_ENDPOINT_URL") or environ.get(_SPARK_ENDPOINT_ENV, "").strip()
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        options.setdefault("AWS_REGION", "us-east-1")
        if endpoint.startswith("http://"):
            options.setdefault("AWS_ALLOW_HTTP", "true")
    options["aws_conditional_put"] = "etag"
    options["max_retries"] = str(MAX_RETRIES)
    options["retry_timeout"] = RETRY_TIMEOUT
    options["AWS_S3_ALLOW_UNSAFE_RENAME"] = "false"
    return options


def filesystem(
    location: str | os.PathLike[str], env: Mapping[str, str] | None = None, *, attempts: int = MAX_RETRIES
) -> tuple[Any, str]:
    """A ``pyarrow.fs`` file system for ``location`` and the path inside it (rule 6); ``attempts``:
    of each S3 request (rule 4; fewer for a check that should answer fast, not ride out an outage)."""
    import pyarrow.fs as pafs

    uri = table_uri(location)
    if is_local(uri):
        return pafs.LocalFileSystem(), uri
    environ = os.environ if env is None else env
    scheme = uri.partition("://")[0].lower()
    if scheme == "gs":
        return _gcs(uri, environ, attempts)
    if scheme == "abfss":
        return _azure(uri, environ)
    if scheme != "s3":
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path
    options = storage_options(uri, env) or {}
    endpoint = options.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {
        "region": options.get("AWS_REGION") or None,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
    }
    if options.get("AWS_ACCESS_KEY_ID"):
        kwargs["access_key"] = options["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = options.get("AWS_SECRET_ACCESS_KEY")
        kwargs["session_token"] = options.get("AWS_SESSION_TOKEN")
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs["endpoint_override"] = host or scheme
        kwargs["scheme"] = scheme if host else "https"
        kwargs["force_virtual_addressing"] = False
    return pafs.S3FileSystem(**kwargs), uri[len("s3://") :]


def _endpoint(url: str) -> tuple[str, str]:
    """``(scheme, host:port)`` of an emulator's URL (``http://host:port``; no scheme: ``http``)."""
    scheme, sep, host = url.strip().rstrip("/").partition("://")
    return (scheme.lower(), host) if sep else ("http", scheme)


def _gcs(uri: str, environ: Mapping[str, str], attempts: int) -> tuple[Any, str]:
    """``gs://bucket/path`` (rule 6)."""
    import pyarrow.fs as pafs

    retry_s = GCS_RETRY_S if attempts >= MAX_RETRIES else GCS_CHECK_RETRY_S
    kwargs: dict[str, Any] = {"retry_time_limit": dt.timedelta(seconds=retry_s)}
    if environ.get(GCS_PROJECT_ENV, "").strip():
        kwargs["project_id"] = environ[GCS_PROJECT_ENV].strip()
    emulator = next((environ[k] for k in GCS_EMULATOR_ENV if environ.get(k, "").strip()), "")
    if emulator:
        scheme, host = _endpoint(emulator)
        if scheme not in ("http", "https") or not host:
            name = next(k for k in GCS_EMULATOR_ENV if environ.get(k, "").strip())
            raise InvalidParameterError(name, emulator, "the emulator's URL, http://<host>:<port>")
        kwargs.update(anonymous=True, scheme=scheme, endpoint_override=host)
    return pafs.GcsFileSystem(**kwargs), uri[len("gs://") :]


def _azure(uri: str, environ: Mapping[str, str]) -> tuple[Any, str]:
    """``abfss://container@account.dfs.core.windows.net/path`` (rule 6)."""
    import pyarrow.fs as pafs

    authority, _, path = uri[len("abfss://") :].partition("/")
    container, at, host = authority.partition("@")
    emulator = environ.get("AZURE_STORAGE_USE_EMULATOR", "").strip().lower() in ("1", "true", "yes")
    account = host.split(".", 1)[0] if at else environ.get("AZURE_STORAGE_ACCOUNT_NAME", "").strip()
    if not account and emulator:
        account = AZURITE_ACCOUNT
    if not container or not account:
        raise InvalidParameterError(
            "location",
            uri,
            "abfss://<container>@<account>.dfs.core.windows.net/<path>, or abfss://<container>/<path> "
            "with the account in AZURE_STORAGE_ACCOUNT_NAME",
        )
    kwargs: dict[str, Any] = {}
    key = environ.get("AZURE_STORAGE_ACCOUNT_KEY", "").strip()
    sas = environ.get("AZURE_STORAGE_SAS_TOKEN", "").strip()
    if key:
        kwargs["account_key"] = key
    elif sas:
        kwargs["sas_token"] = sas
    elif emulator and account == AZURITE_ACCOUNT:
        kwargs["account_key"] = AZURITE_KEY
    if emulator:
        url = environ.get("AZURITE_BLOB_STORAGE_URL", "").strip() or AZURITE_URL
        scheme, authority = _endpoint(url)
        if scheme not in ("http", "https") or not authority:
            raise InvalidParameterError(
                "AZURITE_BLOB_STORAGE_URL", url, "Azurite's URL, http://<host>:<port>"
            )
        kwargs.update(
            blob_storage_authority=authority,
            dfs_storage_authority=authority,
            blob_storage_scheme=scheme,
            dfs_storage_scheme=scheme,
        )
    inner = container + ("/" + path.strip("/") if path.strip("/") else "")
    return pafs.AzureFileSystem(account, **kwargs), inner


def sigv4_authorization(
    method: str,
    path: str,
    query: str,
    headers: dict[str, str],
    access_key: str,
    secret_key: str,
    region: str,
) -> str:
    """The SigV4 ``Authorization`` value of a request whose ``headers`` (lower-case names, ``host``,
    ``x-amz-date`` and ``x-amz-content-sha256`` among them) are all signed. ``path`` is the encoded
    path as sent, ``query`` the raw query string (its pairs are sorted here)."""
    amz_date = headers["x-amz-date"]
    day = amz_date[:8]
    signed = ";".join(sorted(headers))
    pairs = sorted(p if "=" in p else f"{p}=" for p in query.split("&") if p)
    canonical = "\n".join(
        [
            method,
            path,
            "&".join(pairs),
            "".join(f"{k}:{' '.join(headers[k].split())}\n" for k in sorted(headers)),
            signed,
            headers["x-amz-content-sha256"],
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"


def signed_headers(
    method: str,
    endpoint: str,
    path: str,
    access_key: str,
    secret_key: str,
    region: str,
    data: bytes = b"",
    headers: Mapping[str, str] | None = None,
    session_token: str | None = None,
) -> dict[str, str]:
    """The headers (lower-case names, ``host`` and ``authorization`` among them) of a SigV4-signed
    path-style S3 request to ``endpoint`` (``path``: ``/bucket/encoded-key``); ``headers`` (any
    case) are sent and signed. For a client that keeps its connection (``http.client``)."""
    all_headers = {
        "host": urllib.parse.urlsplit(endpoint).netloc,
        "x-amz-content-sha256": hashlib.sha256(data).hexdigest(),
        "x-amz-date": dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ"),
        **{k.lower(): v for k, v in (headers or {}).items()},
    }
    if session_token:
        all_headers["x-amz-security-token"] = session_token
    all_headers["authorization"] = sigv4_authorization(
        method, path, "", all_headers, access_key, secret_key, region
    )
    return all_headers


def signed_request(
    method: str,
    endpoint: str,
    path: str,
    access_key: str,
    secret_key: str,
    region: str,
    data: bytes = b"",
    headers: Mapping[str, str] | None = None,
    session_token: str | None = None,
) -> urllib.request.Request:
    """A SigV4-signed path-style S3 request to ``endpoint`` (``path``: ``/bucket/encoded-key``);
    ``headers`` (any case) are sent and signed. The store probe and the cluster's S3 client send
    it with ``urllib.request.urlopen``."""
    all_headers = signed_headers(
        method, endpoint, path, access_key, secret_key, region, data, headers, session_token
    )
    del all_headers["host"]  # urllib sets it from the URL
    return urllib.request.Request(
        f"{endpoint.rstrip('/')}{path}", data=data or None, method=method, headers=all_headers
    )
