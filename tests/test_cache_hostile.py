"""`rookworld-debug train-tiny` with a document cache in --out that it did not write (damaged, a zip of other
arrays, arrays that disagree, an object array that would need unpickling): one named DataError line, exit 2,
nothing unpickled — as a user runs it (subprocess, stdin closed, timeout)."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from cli import run_cli

TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "1", "--n-positions", "256", "--steps", "1", "--batch-size",
        "2", "--threads", "1", "--m-order", "sorted", "--a-fraction", "0"]


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _write(kind: str, path):
    if kind == "garbage":
        path.write_bytes(b"PK\x03\x04 not a zip at all")
    elif kind == "other_arrays":
        path.write_bytes(_npz(x=np.zeros(3)))
    elif kind == "arrays_disagree":
        path.write_bytes(_npz(key=np.array("k"), p_len=np.array([5]), p_ids=np.zeros(2, np.int32),
                              p_w=np.zeros(1, np.float32), a_len=np.zeros(0, np.int64), a_ids=np.zeros(0, np.int32),
                              a_w=np.zeros(0, np.float32)))
    elif kind == "object_array":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            with z.open("key.npy", "w") as f:
                np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("kind", ["garbage", "other_arrays", "object_array"])
def test_a_cache_it_did_not_write_is_a_named_error(tmp_path, kind):
    from test_train_tiny import _data_lines
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(_data_lines(4, with_a=False)))
    out = tmp_path / "out"
    out.mkdir()
    _write(kind, out / "docs_cache.npz")
    r = run_cli("train-tiny", "--out", out, "--data", data, *TINY, timeout=120)
    err = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and len(err) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    assert "DataError" in err[0] and "docs_cache.npz" in err[0]


def test_arrays_that_disagree_are_refused(tmp_path):
    from rookworld_debug.errors import DataError
    from rookworld_debug.lab.tiny_data import load_docs
    _write("arrays_disagree", tmp_path / "c.npz")
    with pytest.raises(DataError, match="do not agree"):
        load_docs(tmp_path / "c.npz", "k")
    assert load_docs(tmp_path / "c.npz", "another key") is None          # a stale cache is rebuilt, not read
