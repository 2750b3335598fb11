"""Stores on object storage: docs/cluster.md's `dufs convert` to and `dufs select` from ``s3://`` URLs on a 2-worker
cluster, against a real S3-compatible server on 127.0.0.1 (moto's server mode), the credentials coming from the
environment of every process; and a damaged object surfacing as a named error."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import dufs
from dufs.cli import app
from dufs.errors import CorruptChunkError
from tests.deploy._support import bash, readme_line

HEADING = "Object storage"

#: a few feature blocks (not the dozen of the local store): every S3 object is a request to the server
S3_BLOCKS = {"DASK_DUFS__STORE__FEATURE_BLOCK_NNZ": "30000"}


def _flip_a_byte(s3, key: str) -> None:
    body = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))


@pytest.mark.slow
def test_s3_round_trip_selects_what_the_local_store_selects(cluster, s3, train_svm, train_store, monkeypatch):
    s3.client.upload_file(str(train_svm), s3.bucket, "train.svm")
    convert = readme_line(HEADING, "dufs convert")
    select = readme_line(HEADING, "dufs select")
    verify = readme_line(HEADING, "dufs verify")
    url = select.split()[2]
    assert convert.split()[2:4] == [f"s3://{s3.bucket}/train.svm", url]
    env = {**cluster.env, **S3_BLOCKS}

    res = bash(convert, env, cluster.cwd)
    assert res.returncode == 0, res.stderr
    # the store is in the bucket, complete, and nothing of the build is left beside it
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"]}
    name = url.split("/", 3)[3]
    assert f"{name}/zarr.json" in keys
    assert not any(k.startswith((f"{name}.dufs-partial/", f"{name}/dufs.lock")) for k in keys)

    # the same matrix as the store converted to local disk from the same file (its metadata: every chunk is read
    # by the selection below, which checks each one's crc32c)
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    remote, local = dufs.open(url), dufs.open(train_store)
    assert remote.n_blocks("csc") >= 2
    assert (remote.shape, remote.nnz) == (local.shape, local.nnz)
    assert remote.meta.y_checksum == local.meta.y_checksum

    # the same selection: docs/cluster.md's select on the 2 workers (each reading the bucket with the credentials of
    # its own environment), and the same selection on the local store
    res = bash(select, env, cluster.cwd)
    assert res.returncode == 0, res.stderr
    got = dufs.Selection.from_json(cluster.cwd / select.split("-o ")[1].split()[0])
    assert got.diagnostics["n_workers"] == 2 and got.diagnostics["blocks"]["mode"] == "persisted"
    with cluster.client() as client:
        want = dufs.fit(str(train_store), method="fisher", n_features=50, client=client)
    assert got.indices.tolist() == want.indices.tolist() and got.indices.size == 50
    assert np.allclose(got.scores, want.scores, rtol=1e-6, atol=0)

    # a damaged object: the selection on the workers stops with a CorruptChunkError naming the chunk, and the
    # docs/cluster.md's `dufs verify` fails naming it
    chunk = sorted(k for k in keys if k.startswith(f"{name}/csc/1/data/c/"))[0]
    _flip_a_byte(s3, chunk)
    where = chunk[len(name) + 1:]
    with cluster.client() as client, pytest.raises(CorruptChunkError, match=f"chunk {where} is corrupt"):
        dufs.fit(url, method="fisher", n_features=50, client=client)
    res = bash(verify, env, cluster.cwd)
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {url}: 1 damaged chunk: {where} fails its crc32c checksum"), res.stderr


def test_convert_keeps_urls_urls():
    """`dufs convert` takes its inputs and output as strings: a Path made ``memory://x/y.zarr`` into
    ``memory:/x/y.zarr``. One store, and one per input (``--each``), written to URLs."""
    import uuid

    import fsspec

    root = f"memory://dufs-deploy-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    fs.pipe({f"{root}/in/a.svm"[len("memory:/"):]: b"1 1:1 3:2\n-1 2:1\n",
             f"{root}/in/b.svm"[len("memory:/"):]: b"-1 1:3\n1 3:1\n"})
    try:
        res = CliRunner().invoke(app, ["convert", f"{root}/in/a.svm", f"{root}/one.zarr", "--workers", "0"])
        assert res.exit_code == 0, res.output
        assert dufs.open(f"{root}/one.zarr").shape == (2, 3)
        res = CliRunner().invoke(app, ["convert", "--each", f"{root}/in/a.svm", f"{root}/in/b.svm", f"{root}/each",
                                       "--workers", "0"])
        assert res.exit_code == 0, res.output
        assert res.stdout.split() == [f"{root}/each/a.zarr", f"{root}/each/b.zarr"]
        assert dufs.open(f"{root}/each/b.zarr").shape == (2, 3)
    finally:
        fs.rm(root[len("memory:/"):], recursive=True)
