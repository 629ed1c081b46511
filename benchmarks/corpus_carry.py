"""Pack extracted corpus models into folders small enough for one device call's carry.

A device call carries at most 64 MiB: the tracked tree (about 12 MB), the GPU wheels (about
7 MB) and whatever else it names. This packs the named models (default: all) into folders
``.corpus-g1``, ``.corpus-g2``, ... of at most ``--mb`` megabytes each (hard links to the
extracted files, in the cache layout ``models/<package>-<version>/<member>``), largest
models first into the first folder with room, and prints one ``gpu_session.sh`` step per
folder. A model larger than ``--mb`` gets a folder of its own, which only fits a call that
carries less of the tree.

    AUTOSCHED_CORPUS_DIR=.corpus python benchmarks/corpus_carry.py [NAMES...] [--mb 44]
    # then, per folder, on the device (carry [".gpu-wheels", ".corpus-g1", ".gpu-logs-gz"]):
    #   AUTOSCHED_CORPUS_DIR=$PWD/.corpus-g1 OUT=$OUT bash benchmarks/gpu_session.sh ctime:a,b
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="corpus models (default: all)")
    ap.add_argument("--mb", type=float, default=44.0, help="megabytes of models per folder")
    ap.add_argument("--prefix", default=".corpus-g", help="folder name before its number")
    args = ap.parse_args()
    entries = corpus.load_manifest()
    unknown = [n for n in args.names if n not in entries]
    if unknown:
        ap.error(f"unknown models {unknown}")
    paths = {n: corpus.model_path(entries[n]) for n in args.names or entries}
    sizes = {n: p.stat().st_size for n, p in paths.items()}
    for k, names in enumerate(pack(sizes, int(args.mb * 1e6)), 1):
        root = Path(f"{args.prefix}{k}")
        shutil.rmtree(root, ignore_errors=True)
        for n in names:
            dest = root / paths[n].relative_to(corpus.cache_dir())
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(paths[n], dest)
        mb = sum(sizes[n] for n in names) / 1e6
        print(f"{root} ({mb:.1f} MB): ctime:{','.join(names)}")


if __name__ == "__main__":
    main()
