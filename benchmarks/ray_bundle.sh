#!/usr/bin/env bash
# Build the offline Ray bundle that benchmarks/gpu_session.sh's `ray` step carries (.ray-bundle/):
#
#   ray-slim.tar.xz  ray 2.60.0 (the `cluster` extra's pin) from its cp312 manylinux wheel, less
#                    what a local cluster running actors and tasks does not use (PRUNE below);
#                    `tar xJf ray-slim.tar.xz -C SITE` gives SITE/ray and SITE/ray-2.60.0.dist-info
#   *.whl            ray's runtime dependencies for CPython 3.12 on Linux x86_64, pinned to the
#                    versions in .venv (DEPS below)
#
# xgboost-cpu is not in the bundle: .gpu-wheels, which every GPU session carries and installs,
# already holds xgboost_cpu-3.4.1 (py3, manylinux_2_28) for the device.
#
#   benchmarks/ray_bundle.sh [--check] [DIR]     # build DIR (default .ray-bundle); --check: then test it
#   benchmarks/ray_bundle.sh --check-only [DIR]  # test an existing bundle
#
# The check emulates the device offline: unpacks the bundle into a fresh site folder the way
# gpu_session.sh does, then, with a CPython 3.12 that has nothing but numpy and scipy besides,
# starts ray.cluster_utils.Cluster (a head without CPUs, two nodes of one CPU and resource "x"
# each), runs one actor per node, then tasks, and imports xgboost from $GPU_WHEELS. Needs the
# registry for numpy and scipy.
#
# Environment: PYTHON runs `pip download` (default: .venv/bin/python); CHECK_PYTHON is the
# CPython 3.12 for the check (default: python3.12 on PATH); GPU_WHEELS is
# the folder with xgboost's wheel for the check (default: .gpu-wheels).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=1 check=0
case "${1:-}" in
    --check) check=1; shift ;;
    --check-only) build=0 check=1; shift ;;
esac
out=$(realpath -m "${1:-$root/.ray-bundle}")
PYTHON=${PYTHON:-$root/.venv/bin/python}
CHECK_PYTHON=${CHECK_PYTHON:-$(python3.12 -c "import sys; print(sys.executable)" 2>/dev/null \
    || echo python3.12)}
GPU_WHEELS=${GPU_WHEELS:-$root/.gpu-wheels}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

RAY=ray==2.60.0
# ray's Requires-Dist and theirs (jsonschema: attrs, jsonschema-specifications, referencing,
# rpds-py; referencing: typing-extensions below Python 3.13; requests: charset-normalizer, idna,
# urllib3, certifi), at .venv's versions
DEPS=(click==8.5.1 filelock==4.3.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
      referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 typing-extensions==4.16.0
      msgpack==1.2.4 packaging==26.4 protobuf==7.36.2 pyyaml==6.0.4 requests==2.34.2
      charset-normalizer==3.5.3 idna==3.21 urllib3==2.8.0 certifi==2026.10.19.post1)

# Removed from the ray wheel (paths under ray/). What stays: ray's core (the raylet and GCS
# binaries, _raylet.so, _private, runtime_env with its agent and its vendored aiohttp, which the
# raylet starts on every node), the dashboard's Python side (the raylet starts its agent),
# autoscaler, util, dag, experimental, widgets (_private/worker.py imports it).
PRUNE=(
    jars                 # the Java worker's classes (34 MB): cross-language calls only
    dashboard/client     # the dashboard's web front end (built JS, source maps)
    serve tune train rllib data llm air   # libraries on top of ray core; core imports none
    includes _raylet.pxd setup-dev.py     # Cython declarations and a developer script
)

# pip download for the device's interpreter and platform, wheels only, no resolution
download() {
    "$PYTHON" -m pip download -q --disable-pip-version-check -d "$1" --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
        --no-deps "${@:2}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

build_bundle() {
    local tmp=$work/build
    rm -rf "$out" && mkdir -p "$out"

    echo "== downloading $RAY and ${#DEPS[@]} dependencies"
    download "$tmp/ray" "$RAY"
    download "$out" "${DEPS[@]}"

    echo "== unpacking and pruning ray"
    # unzip keeping the executable bits (the raylet and the GCS server are programs)
    "$PYTHON" - "$tmp"/ray/ray-*.whl "$tmp/stage" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as whl:
    for info in whl.infolist():
        path = whl.extract(info, sys.argv[2])
        if not info.is_dir():
            os.chmod(path, 0o755 if info.external_attr >> 16 & 0o111 else 0o644)
PY
    local before p
    before=$(du -sm "$tmp/stage/ray" | cut -f1)
    for p in "${PRUNE[@]}"; do
        rm -rf "${tmp:?}/stage/ray/$p"
    done
    echo "ray/: ${before} MB unpacked, $(du -sm "$tmp/stage/ray" | cut -f1) MB after pruning"

    echo "== packing ray-slim.tar.xz (xz -9)"
    tar -C "$tmp/stage" --owner=0 --group=0 --sort=name -cf - ray ray-2.60.0.dist-info \
        | xz -9 -T0 > "$out/ray-slim.tar.xz"
}

check_bundle() {
    local tmp=$work/check rc=0
    echo "== check with $("$CHECK_PYTHON" --version) in $tmp"
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    # as gpu_session.sh does on the device, offline
    mkdir -p "$tmp/site"
    tar xJf "$out/ray-slim.tar.xz" -C "$tmp/site"
    "$CHECK_PYTHON" -m pip install -q --no-index --no-deps \
        --target "$tmp/site" "$out"/*.whl
    # numpy and scipy (xgboost imports it), which the device has, into a folder of their own;
    # xgboost as on the device
    "$CHECK_PYTHON" -m pip install -q --target "$tmp/numpy" numpy scipy
    local xgb=""
    if compgen -G "$GPU_WHEELS/xgboost*.whl" > /dev/null; then
        "$CHECK_PYTHON" -m pip install -q --no-index --no-deps \
            --target "$tmp/xgb" "$GPU_WHEELS"/xgboost*.whl
        xgb=$tmp/xgb
    fi
    cat > "$tmp/check.py" <<'EOF'
import os
import sys

import ray
from ray.cluster_utils import Cluster

print("ray", ray.__version__, "from", os.path.dirname(ray.__file__))
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
for _ in range(2):
    cluster.add_node(num_cpus=1, resources={"x": 1})
ray.init(address=cluster.address)
try:
    @ray.remote(num_cpus=1, resources={"x": 1})
    class Probe:
        def where(self):
            return os.getpid(), ray.get_runtime_context().get_node_id()

    @ray.remote(num_cpus=1)
    def square(v):
        return v * v

    actors = [Probe.remote() for _ in range(2)]
    found = ray.get([a.where.remote() for a in actors], timeout=120)
    for pid, node in found:
        print(f"actor pid {pid} on node {node[:12]}")
    assert len({node for _, node in found}) == 2, "the two actors share a node"
    for a in actors:  # each holds its node's CPU
        ray.kill(a)
    assert ray.get([square.remote(v) for v in range(5)], timeout=60) == [0, 1, 4, 9, 16]
    print("remote tasks: ok")
finally:
    ray.shutdown()
    cluster.shutdown()
if len(sys.argv) > 1:
    import xgboost
    print("xgboost", xgboost.__version__)
print("ray bundle check: ok")
EOF
    (cd "$tmp" && PYTHONNOUSERSITE=1 PYTHONPATH="$tmp/site:$root:$tmp/numpy${xgb:+:$xgb}" \
        timeout 300 "$CHECK_PYTHON" check.py ${xgb:+xgboost}) || rc=$?
    if [ -z "$xgb" ]; then echo "(no xgboost wheel in $GPU_WHEELS: xgboost not checked)"; fi
    return "$rc"
}

if [ "$build" = 1 ]; then build_bundle; fi
if [ "$check" = 1 ]; then check_bundle; fi
echo "== $out"
ls -l "$out"
echo "total: $(du -cb "$out"/* | tail -1 | cut -f1) bytes ($(du -sh "$out" | cut -f1))"
