"""Pack extracted corpus models into folders small enough for one device call's carry.

A device call carries at most 64 MiB: the tracked tree (about 12 MB), the GPU wheels (about
7 MB) and whatever else it names. This packs the named models (default: all) into folders
``.corpus-g1``, ``.corpus-g2``, ... of at most ``--mb`` megabytes each (hard links to the
extracted files, in the cache layout ``models/<package>-<version>/<member>``), largest
models first into the first folder with room, and prints one ``gpu_session.sh`` step per
folder. A model larger than ``--mb`` gets a folder of its own, packed (below).

    AUTOSCHED_CORPUS_DIR=.corpus python benchmarks/corpus_carry.py [NAMES...] [--mb 44]
    # then, per folder, on the device (carry [".gpu-wheels", ".corpus-g1", ".gpu-logs-gz"]):
    #   AUTOSCHED_CORPUS_DIR=$PWD/.corpus-g1 OUT=$OUT bash benchmarks/gpu_session.sh ctime:a,b

A model larger than ``--mb`` travels packed (``pack_file``: xz of its bytes with each 4-byte
word's bytes gathered into planes, which puts float32 weights' exponents together: ddddocr's
51.6 MB model in 45.7 MB, which fits one call beside the tree); ``gpu_session.sh ctime:``
unpacks it on the device (``--unpack DIR``) to the very bytes it was.
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import corpus  # noqa: E402


def pack(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Names grouped so that each group's sizes add to at most ``limit`` (first fit,
    largest first; a name larger than ``limit`` alone)."""
    groups: list[list[str]] = []
    room: list[int] = []
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        for k, left in enumerate(room):
            if sizes[name] <= left:
                groups[k].append(name)
                room[k] -= sizes[name]
                break
        else:
            groups.append([name])
            room.append(limit - sizes[name])
    return groups


PACKED = ".packed.xz"  # a model over the folder limit travels as NAME + PACKED
_MAGIC = b"ASPK1"
_SAMPLE = 4 << 20  # bytes of the middle of a file tried at each word offset


def _planes(data: bytes, off: int) -> tuple[bytes, int]:
    """The 4-byte words of ``data`` from ``off`` with their bytes in planes, and how many
    bytes that covers."""
    n = (len(data) - off) // 4 * 4
    words = np.frombuffer(data, np.uint8, count=n, offset=off).reshape(-1, 4)
    return words.T.tobytes(), n


def pack_file(src: Path, dest: Path) -> None:
    """``src`` packed into ``dest``: xz of a header, the bytes before and after the words, and
    the words' bytes in planes from the offset (0-3) at which a sample compresses best."""
    data = src.read_bytes()
    mid = max(0, len(data) // 2 - _SAMPLE // 2) // 4 * 4
    sample = data[mid:mid + _SAMPLE + 4]
    off = min(range(4), key=lambda o: len(lzma.compress(_planes(sample, o)[0], preset=1)))
    body, n = _planes(data, off)
    with lzma.open(dest, "wb", preset=6) as f:
        f.write(_MAGIC + struct.pack("<qqq", len(data), off, n))
        f.write(data[:off] + data[off + n:] + body)


def unpack_file(src: Path) -> Path:
    """The file ``pack_file`` packed into ``src``, written beside it (its name without
    PACKED); a file that is no such pack is refused with its name."""
    raw = lzma.open(src).read()
    head = len(_MAGIC) + 24
    if raw[:len(_MAGIC)] != _MAGIC or len(raw) < head:
        raise ValueError(f"{src}: not a packed model")
    total, off, n = struct.unpack("<qqq", raw[len(_MAGIC):head])
    rest = total - off - n
    if min(total, off, n, rest) < 0 or len(raw) != head + total:
        raise ValueError(f"{src}: a packed model of {total} bytes holds {len(raw) - head}")
    outer = raw[head:head + off + rest]
    words = np.frombuffer(raw, np.uint8, offset=head + off + rest).reshape(4, -1).T.tobytes()
    out = src.with_name(src.name[:-len(PACKED)])
    out.write_bytes(outer[:off] + words + outer[off:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="corpus models (default: all)")
    ap.add_argument("--mb", type=float, default=44.0, help="megabytes of models per folder")
    ap.add_argument("--prefix", default=".corpus-g", help="folder name before its number")
    ap.add_argument("--unpack", metavar="DIR", help="unpack the packed models under DIR, only")
    args = ap.parse_args()
    if args.unpack:
        for packed in sorted(Path(args.unpack).rglob("*" + PACKED)):
            print(f"unpacked {unpack_file(packed)}")
        return
    entries = corpus.load_manifest()
    unknown = [n for n in args.names if n not in entries]
    if unknown:
        ap.error(f"unknown models {unknown}")
    paths = {n: corpus.model_path(entries[n]) for n in args.names or entries}
    sizes = {n: p.stat().st_size for n, p in paths.items()}
    for k, names in enumerate(pack(sizes, int(args.mb * 1e6)), 1):
        root = Path(f"{args.prefix}{k}")
        shutil.rmtree(root, ignore_errors=True)
        carried = 0
        for n in names:
            dest = root / paths[n].relative_to(corpus.cache_dir())
            dest.parent.mkdir(parents=True, exist_ok=True)
            if sizes[n] > args.mb * 1e6:
                dest = dest.with_name(dest.name + PACKED)
                pack_file(paths[n], dest)
            else:
                os.link(paths[n], dest)
            carried += dest.stat().st_size
        print(f"{root} ({carried / 1e6:.1f} MB): ctime:{','.join(names)}")


if __name__ == "__main__":
    main()
