"""A minimal S3 client (AWS Signature Version 4, path-style, standard library only).

What the local cluster needs and no more: list buckets (the health probe), create a
bucket, and put an object with ``If-None-Match: *`` (the conditional create that
delta-rs commits rely on). Spark reaches the store through S3A and delta-rs through its
own client; this one only runs the probes, so it imports neither boto3 nor pyarrow.

Errors never carry the secret key or a signature: :class:`S3Error` holds the HTTP status,
the S3 error code and the request's method and path.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from splitkeeper.delta.storage import signed_request
from splitkeeper.errors import SplitkeeperError


class S3Error(SplitkeeperError):
    """An S3 request failed: ``status`` (HTTP) and ``s3_code`` (e.g. ``PreconditionFailed``)."""

    code = "S3_ERROR"

    def __init__(self, method: str, path: str, status: int, s3_code: str, message: str = "") -> None:
        text = f"S3 {method} {path} failed: HTTP {status} {s3_code}"
        if message:
            text += f" ({message})"
        super().__init__(text, method=method, path=path, status=status, s3_code=s3_code)
        self.status = status
        self.s3_code = s3_code


@dataclass(frozen=True)
class S3Client:
    """Signs requests to ``endpoint`` (``http://127.0.0.1:PORT``) with one access key pair."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    timeout_s: float = 5.0

    def list_buckets(self) -> list[str]:
        """ListBuckets: the bucket names."""
        body = self._request("GET", "/")
        return re.findall(r"<Name>([^<]+)</Name>", body.decode("utf-8", "replace"))

    def create_bucket(self, bucket: str) -> bool:
        """CreateBucket; False when this account already owns it."""
        try:
            self._request("PUT", f"/{bucket}")
        except S3Error as err:
            if err.s3_code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return False
            raise
        return True

    def put_object(self, bucket: str, key: str, data: bytes, *, if_none_match: bool = False) -> None:
        """PutObject; with ``if_none_match`` only if no object has that key (else S3Error 412)."""
        headers = {"If-None-Match": "*"} if if_none_match else {}
        self._request("PUT", f"/{bucket}/{urllib.parse.quote(key)}", data, headers)

    def get_object(self, bucket: str, key: str) -> bytes:
        return self._request("GET", f"/{bucket}/{urllib.parse.quote(key)}")

    # -- signing -------------------------------------------------------------------

    def _request(
        self, method: str, path: str, data: bytes = b"", headers: dict[str, str] | None = None
    ) -> bytes:
        request = signed_request(
            method, self.endpoint, path, self.access_key, self.secret_key, self.region, data, headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            body = err.read().decode("utf-8", "replace")
            code = re.search(r"<Code>([^<]+)</Code>", body)
            message = re.search(r"<Message>([^<]+)</Message>", body)
            raise S3Error(
                method, path, err.code, code.group(1) if code else "", message.group(1) if message else ""
            ) from None


def main(argv: list[str] | None = None) -> int:
    """``python -m splitkeeper_tools.cluster.s3 create-bucket NAME | list-buckets``.

    The endpoint and keys come from the environment deltalake reads too: ``AWS_ENDPOINT_URL``,
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (``AWS_REGION``, default us-east-1). Waits up to
    ``--wait`` seconds for the store to answer (docker-compose's object-store-init runs this).
    """
    import argparse
    import os
    import sys
    import time

    parser = argparse.ArgumentParser(prog="python -m splitkeeper_tools.cluster.s3", description=main.__doc__)
    parser.add_argument("action", choices=["create-bucket", "list-buckets"])
    parser.add_argument("bucket", nargs="?")
    parser.add_argument("--wait", type=float, default=60.0)
    args = parser.parse_args(argv)
    missing = [
        v for v in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(v)
    ]
    if missing or (args.action == "create-bucket" and not args.bucket):
        print(f"needs {', '.join(missing) or 'a bucket name'}", file=sys.stderr)
        return 2
    client = S3Client(
        os.environ["AWS_ENDPOINT_URL"],
        os.environ["AWS_ACCESS_KEY_ID"],
        os.environ["AWS_SECRET_ACCESS_KEY"],
        os.environ.get("AWS_REGION", "us-east-1"),
    )
    deadline = time.monotonic() + args.wait
    while True:
        try:
            buckets = client.list_buckets()
            break
        except (OSError, S3Error) as err:
            if time.monotonic() > deadline:
                print(f"the object store at {client.endpoint} did not answer: {err}", file=sys.stderr)
                return 1
            time.sleep(1)
    if args.action == "list-buckets":
        print("\n".join(buckets))
        return 0
    created = client.create_bucket(args.bucket)
    print(f"bucket {args.bucket} {'created' if created else 'already there'} at {client.endpoint}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
