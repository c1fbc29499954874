#!/bin/sh
# minio-init (docker-compose.yml): create the bucket the Delta state and sink tables live in.
# Idempotent: an existing bucket is kept.
set -eu
bucket="${SPLITKEEPER_BUCKET:-splitkeeper}"
until mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null; do
    echo "[minio-init] waiting for minio"
    sleep 2
done
mc mb --ignore-existing "local/$bucket"
mc ls local
echo "[minio-init] bucket $bucket ready"
