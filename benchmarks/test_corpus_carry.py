"""benchmarks/corpus_carry.py: models packed into carry-sized folders, and a model over the
limit packed and unpacked to its very bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.corpus_carry import PACKED, pack, pack_file, unpack_file


def test_every_model_in_one_group_within_the_limit() -> None:
    rng = np.random.default_rng()
    sizes = {f"m{k}": int(v) for k, v in enumerate(rng.integers(1, 30, 40))}
    sizes["huge"] = 80  # larger than the limit: a group of its own
    groups = pack(sizes, 44)
    assert sorted(n for g in groups for n in g) == sorted(sizes)
    assert ["huge"] in groups
    assert all(sum(sizes[n] for n in g) <= 44 for g in groups if g != ["huge"])
    # first fit, largest first: no two groups' contents would fit in one
    small = [sum(sizes[n] for n in g) for g in groups if g != ["huge"]]
    assert sum(1 for s in small if s <= 22) <= 1


@pytest.mark.parametrize("prefix", [0, 3, 6])
def test_a_packed_model_unpacks_to_its_bytes(prefix: int, tmp_path: Path) -> None:
    """Float32 weights after a header of any length, plus a tail that is no whole word:
    packed smaller than they are (their exponents in one plane), unpacked byte for byte."""
    rng = np.random.default_rng()
    weights = rng.normal(0, 0.05, 50_000).astype(np.float32).tobytes()
    data = rng.bytes(prefix) + weights + rng.bytes(3)
    src = tmp_path / "m.onnx"
    src.write_bytes(data)
    packed = tmp_path / ("m.onnx" + PACKED)
    pack_file(src, packed)
    assert packed.stat().st_size < len(data)
    src.unlink()
    assert unpack_file(packed) == src and src.read_bytes() == data


def test_a_file_that_is_no_pack_is_refused_by_name(tmp_path: Path) -> None:
    import lzma

    bad = tmp_path / ("x.onnx" + PACKED)
    bad.write_bytes(lzma.compress(b"not a model"))
    with pytest.raises(ValueError, match="x.onnx.packed.xz: not a packed model"):
        unpack_file(bad)
