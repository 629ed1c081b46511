"""A stand-in CUDA driver, so that CI (no GPU) runs a CUDA model library end to end.

``MOCK`` is a ``libcuda.so.1`` in C: device memory is host memory, modules remember their image,
and ``cuLaunchKernel`` hands the function's image, name, launch sizes and parameters to a
callback. Streams made by ``cuStreamCreate`` can record: what is queued on one between
``cuStreamBeginCapture_v2`` and ``cuStreamEndCapture`` is kept (a kernel's parameter values
copied, as the driver copies them) and runs at each ``cuGraphLaunch``; a stream that records
refuses copies to or from the host and synchronisation, the legacy stream refuses to record,
and ``mock_graphs(0)`` poses as a driver that cannot record at all. ``Emulator`` is that callback: it finds which kernel module (and arch) the image is,
by its bytes, and runs the kernel's CUDA C on the CPU through the host emulation
(targets/cuda/host_emulate.py, checked: an access outside the buffer a parameter is given is an
error). So the library's own C (arch choice, memory plan, call order, arguments, copies, status
word) runs unchanged, only the driver under it is another.

The library dlopens ``libcuda.so.1`` by name, which finds the stand-in once it is loaded (its
SONAME is that name); a process that loads it has no real driver afterwards, so the scenario
runs in a child process: ``python -m tests.deploy.mock_cuda MODEL ARCHS CC DIR
[--weights-file]`` prints a JSON report (see ``main``).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

MOCK = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int (*launcher)(const void *image, const char *name, const unsigned *dims, void **params);
typedef int (*counter)(const void *image, const char *name);
typedef struct { const void *image; } module;
typedef struct { const void *image; char name[256]; int dynamic_shared; } function;

static const char MAP_MAGIC[8] = "tmap-v1";
static launcher on_launch;
static counter param_count;
static int cc = 90, devices = 1, live = 0, opted_in = 0;
static long long memory = -1; /* bytes cuMemAlloc may still give; -1: any */

void mock_configure(int compute_capability, int count, long long bytes, launcher l) {
  cc = compute_capability; devices = count; memory = bytes; on_launch = l; opted_in = 0;
}
int mock_live(void) { return live; } /* contexts, modules, allocations, streams, graphs */
int mock_opted_in(void) { return opted_in; } /* functions given dynamic shared memory */

/* -- recording streams and graphs -- */
enum { KERNEL, MEMSET, DTOD };
typedef struct {
  int kind;
  function *f;
  unsigned dims[7]; /* grid, block, dynamic shared bytes */
  int n;
  unsigned long long values[32]; /* a kernel's parameters; MEMSET: d, v, n; DTOD: d, s, n */
  unsigned char maps[32][128];   /* a kernel's TMA descriptors, by parameter */
} op;
typedef struct { op *ops; int n, size; } graph;
typedef struct { graph *recording; } stream;
enum { RECORDED, INSTANTIATED, UPDATED, GRAPH_LAUNCHES, DIRECT, ENCODED, N_STATS };
static int graphs_work = 1;
static int stats[N_STATS];

void mock_graphs(int work, counter c) {
  graphs_work = work; param_count = c; memset(stats, 0, sizeof stats);
}
void mock_graph_stats(int *out) { memcpy(out, stats, sizeof stats); }

static graph *recording(void *s) { return s ? ((stream *)s)->recording : NULL; }
static op *add(graph *g, int kind) {
  if (g->n == g->size) {
    g->size = g->size ? 2 * g->size : 16;
    g->ops = realloc(g->ops, g->size * sizeof *g->ops);
  }
  op *o = &g->ops[g->n++];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  return o;
}
static graph *copy_graph(const graph *g) {
  graph *c = calloc(1, sizeof *c);
  c->n = c->size = g->n;
  c->ops = malloc((g->n + 1) * sizeof *g->ops);
  memcpy(c->ops, g->ops, g->n * sizeof *g->ops);
  live++;
  return c;
}
static void free_graph(graph *g) { free(g->ops); free(g); live--; }

CUresult cuStreamCreate(void **s, unsigned flags) {
  (void)flags; *s = calloc(1, sizeof(stream)); live++; return 0;
}
CUresult cuStreamDestroy_v2(void *s) { free(s); live--; return 0; }
CUresult cuStreamBeginCapture_v2(void *s, int mode) {
  (void)mode;
  if (!graphs_work) return 801; /* CUDA_ERROR_NOT_SUPPORTED */
  if (!s || recording(s)) return 900; /* the legacy stream cannot record */
  ((stream *)s)->recording = calloc(1, sizeof(graph));
  live++;
  return 0;
}
CUresult cuStreamEndCapture(void *s, void **g) {
  if (!recording(s)) return 901;
  *g = recording(s);
  ((stream *)s)->recording = NULL;
  stats[RECORDED]++;
  return 0;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *g, unsigned long long flags) {
  (void)flags; *exec = copy_graph(g); stats[INSTANTIATED]++; return 0;
}
CUresult cuGraphExecUpdate_v2(void *exec, void *g, void *info) {
  graph *e = exec, *n = g;
  int same = e->n == n->n;
  for (int i = 0; same && i < n->n; i++)
    same = e->ops[i].kind == n->ops[i].kind && e->ops[i].f == n->ops[i].f;
  if (!same) { *(int *)info = 1; return 910; } /* CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE */
  memcpy(e->ops, n->ops, n->n * sizeof *n->ops);
  *(int *)info = 0;
  stats[UPDATED]++;
  return 0;
}
CUresult cuGraphExecDestroy(void *exec) { free_graph(exec); return 0; }
CUresult cuGraphDestroy(void *g) { free_graph(g); return 0; }

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = devices; return 0; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return i < devices ? 0 : 101; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  (void)d; *v = attr == 75 ? cc / 10 : attr == 76 ? cc % 10 : 0; return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
  *c = (void *)(intptr_t)(d + 1); live++; return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; live--; return 0; }
CUresult cuCtxPushCurrent_v2(void *c) { (void)c; return 0; }
CUresult cuCtxPopCurrent_v2(void **c) { *c = NULL; return 0; }
CUresult cuModuleLoadData(void **m, const void *image) {
  module *x = malloc(sizeof *x); x->image = image; *m = x; live++; return 0;
}
CUresult cuModuleUnload(void *m) { free(m); live--; return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  static function table[4096]; static int used;
  if (used == 4096) return 2;
  function *x = &table[used++];
  x->image = ((module *)m)->image;
  strncpy(x->name, name, sizeof x->name - 1);
  x->dynamic_shared = 0;
  *f = x;
  return 0;
}
/* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8), up to an sm_90's 227 KB */
CUresult cuFuncSetAttribute(void *f, int attrib, int value) {
  if (attrib != 8 || value < 0 || value > 227 * 1024) return 1;
  ((function *)f)->dynamic_shared = value;
  opted_in++;
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (memory >= 0 && (long long)n > memory) return 2;
  if (memory >= 0) memory -= (long long)n;
  void *q = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!q) return 2;
  memset(q, 0xA5, n); /* garbage: nothing may rely on fresh memory being zero */
  *p = (CUdeviceptr)(uintptr_t)q; live++; return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); live--; return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
  if (recording(st)) return 900;
  memcpy((void *)(uintptr_t)d, s, n); return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
  if (recording(st)) return 900;
  memcpy(d, (const void *)(uintptr_t)s, n); return 0;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
  if (recording(st)) {
    op *o = add(recording(st), DTOD);
    o->values[0] = d; o->values[1] = s; o->values[2] = n;
    return 0;
  }
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n); return 0;
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *st) {
  if (recording(st)) {
    op *o = add(recording(st), MEMSET);
    o->values[0] = d; o->values[1] = v; o->values[2] = n;
    return 0;
  }
  for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)d)[i] = v; return 0;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                        void **extra) {
  (void)extra;
  unsigned dims[7] = {gx, gy, gz, bx, by, bz, shared};
  function *fn = f;
  /* stricter than a driver (which needs the opt-in above 48 KB only): the library opts in
     to every byte of dynamic shared memory it launches with */
  if ((int)shared > fn->dynamic_shared) return 1;
  if (recording(stream)) { /* the parameters' values now: the caller's array may go */
    op *o = add(recording(stream), KERNEL);
    o->f = fn;
    memcpy(o->dims, dims, sizeof dims);
    o->n = param_count(fn->image, fn->name);
    if (o->n < 0 || o->n > 32) return 1;
    for (int j = 0; j < o->n; j++) {
      memcpy(&o->values[j], params[j], 8);
      if (!memcmp(params[j], MAP_MAGIC, 8)) memcpy(o->maps[j], params[j], 128);
    }
    return 0;
  }
  stats[DIRECT]++;
  return on_launch(fn->image, fn->name, dims, params) ? 719 : 0;
}
CUresult cuGraphLaunch(void *exec, void *s) {
  if (recording(s)) return 900;
  graph *e = exec;
  stats[GRAPH_LAUNCHES]++;
  for (int i = 0; i < e->n; i++) {
    op *o = &e->ops[i];
    void *params[32];
    for (int j = 0; j < o->n; j++)
      params[j] = memcmp(o->maps[j], MAP_MAGIC, 8) ? (void *)&o->values[j] : o->maps[j];
    if (o->kind == KERNEL && on_launch(o->f->image, o->f->name, o->dims, params)) return 719;
    if (o->kind == MEMSET)
      for (size_t k = 0; k < o->values[2]; k++)
        ((unsigned *)(uintptr_t)o->values[0])[k] = (unsigned)o->values[1];
    if (o->kind == DTOD)
      memmove((void *)(uintptr_t)o->values[0], (const void *)(uintptr_t)o->values[1],
              o->values[2]);
  }
  return 0;
}
/* a TMA descriptor: what it was given (the emulator checks it against the kernel's map);
   element strides of 1, no interleave, the 128-byte swizzle and zero fill, or an error */
typedef struct {
  char magic[8];
  int dtype, rank;
  unsigned long long address, dims[5], strides[4];
  unsigned box[5];
} tensor_map;
CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank, void *address,
                                const unsigned long long *dims,
                                const unsigned long long *strides, const unsigned *box,
                                const unsigned *element_strides, int interleave, int swizzle,
                                int promotion, int fill) {
  (void)promotion;
  if ((uintptr_t)map % 64 || rank < 1 || rank > 5 || interleave || swizzle != 3 || fill)
    return 1;
  tensor_map *t = map;
  stats[ENCODED]++;
  memset(t, 0, 128);
  memcpy(t->magic, MAP_MAGIC, 8);
  t->dtype = dtype; t->rank = (int)rank; t->address = (uintptr_t)address;
  for (unsigned d = 0; d < rank; d++) {
    if (element_strides[d] != 1) return 1;
    t->dims[d] = dims[d]; t->box[d] = box[d];
    if (d + 1 < rank) t->strides[d] = strides[d];
  }
  return 0;
}
CUresult cuStreamSynchronize(void *s) { return recording(s) ? 900 : 0; }
CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : r == 719 ? "CUDA_ERROR_LAUNCH_FAILED"
     : "CUDA_ERROR_UNKNOWN";
  return 0;
}
"""

LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                            ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_void_p))
COUNTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
# (inputs, outputs) of each run_device: the same pointers, then other inputs only, other
# outputs only, both
DEVICE_RUNS = ((0, 0), (0, 0), (1, 0), (1, 1), (0, 0))
GRAPH_STATS = ("recorded", "instantiated", "updated", "graph_launches", "direct_launches",
               "tensor_maps")


def build_mock(folder: Path) -> Path:
    """The stand-in driver, compiled with the host's cc as ``folder``/libcuda.so.1."""
    (folder / "mock_cuda.c").write_text(MOCK)
    lib = folder / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1",
                    str(folder / "mock_cuda.c"), "-o", str(lib)], check=True)
    return lib


class Emulator:
    """The launch callback: each kernel run on the CPU by the host emulation of its module."""

    def __init__(self, modules: list[Any], archs: tuple[str, ...]) -> None:
        from autosched.targets.cuda import nvrtc_options
        from autosched.targets.cuda.nvrtc import compile_cuda

        self.binaries = [(m, arch, compile_cuda(m.source.code,
                                                arch + "a" * m.source.arch_specific,
                                                nvrtc_options(m.target),
                                                needs_headers=m.source.uses_half,
                                                name=f"{m.func.name}.cu").data)
                         for m in modules for arch in archs]
        self.archs: set[str] = set()  # the archs whose code ran
        self.launches = 0
        self.errors: list[str] = []
        self.callback = LAUNCHER(self._launch)
        self.counter = COUNTER(self._count)

    def _kernel(self, image: int, name: str) -> tuple[Any, str]:
        """The module (and arch) whose code is ``image`` and that has kernel ``name``."""
        found = [(m, arch) for m, arch, data in self.binaries
                 if name in m.kernel_names and ctypes.string_at(image, len(data)) == data]
        if len(found) != 1:
            raise AssertionError(f"the image launched is {len(found)} of the modules")
        return found[0]

    def _count(self, image: int, name: bytes) -> int:
        """How many parameters kernel ``name`` takes (its buffers and status word); -1 when
        it is no kernel of the modules."""
        try:
            module, _ = self._kernel(image, name.decode())
        except AssertionError as exc:
            self.errors.append(f"{name.decode()}: {exc}")
            return -1
        info = module.source.kernels[module.kernel_names.index(name.decode())]
        return len(info.tensor_maps) + len(info.buffers) + info.checks

    def _launch(self, image: int, name: bytes, dims: Any, params: Any) -> int:
        try:
            self.run(image, name.decode(), [dims[i] for i in range(7)], params)
            return 0
        except Exception as exc:  # a launch the library got wrong: reported, not raised in C
            self.errors.append(f"{name.decode()}: {type(exc).__name__}: {exc}")
            return 1

    def run(self, image: int, name: str, dims: list[int], params: Any) -> None:
        from autosched.targets.cuda import host_emulate as he

        module, arch = self._kernel(image, name)
        self.archs.add(arch)
        self.launches += 1
        k = module.kernel_names.index(name)
        info = module.source.kernels[k]
        if dims[6] != info.dynamic_shared:  # on a GPU: shared accesses out of bounds
            raise AssertionError(f"launched with {dims[6]} bytes of dynamic shared memory, "
                                 f"the kernel carves {info.dynamic_shared}")
        program = he._program(module.source, checked=True)
        lib = he._library(program.text)
        maps = len(info.tensor_maps)
        for j, (buf, tm) in enumerate(info.tensor_maps):
            _check_descriptor(ctypes.string_at(params[j], 128), tm,
                              ctypes.c_uint64.from_address(params[maps + info.buffers.index(buf)]
                                                           ).value)
        values = [ctypes.c_uint64.from_address(params[maps + j]).value
                  for j in range(len(info.buffers) + info.checks)]
        n = len(info.buffers)
        ptrs = (ctypes.c_void_p * max(n, 1))(*values[:n])
        sizes = (ctypes.c_longlong * max(n, 1))(
            *[he._nbytes(b, {}) // b.itemsize for b in info.buffers])
        scalars = (ctypes.c_longlong * 1)()
        status = (ctypes.c_int.from_address(values[n]) if info.checks else ctypes.c_int(0))
        fn = getattr(lib, f"as_launch_{program.kernels[k].name}")
        fn.restype = ctypes.c_int
        code = fn(ptrs, sizes, scalars, (ctypes.c_longlong * 6)(*dims[:6]), ctypes.c_int(0),
                  ctypes.c_double(60.0), ctypes.byref(status))
        if code:
            raise AssertionError(lib.as_error().decode(errors="replace"))


def _check_descriptor(raw: bytes, tm: Any, address: int) -> None:
    """AssertionError unless the library encoded ``tm`` over ``address`` as tma.encode does
    (the stand-in's cuTensorMapEncodeTiled keeps what it was given: MOCK's tensor_map)."""
    from autosched.targets.cuda.tma import DATA_TYPES

    dtype, rank = (int(x) for x in np.frombuffer(raw[8:16], np.int32))
    words = [int(x) for x in np.frombuffer(raw[16:96], np.uint64)]
    box = [int(x) for x in np.frombuffer(raw[96:116], np.uint32)]
    got = (raw[:8], dtype, rank, words[0], words[1:1 + rank], words[6:5 + rank], box[:rank])
    want = (b"tmap-v1\0", DATA_TYPES[tm.dtype], len(tm.shape), address,
            list(reversed(tm.shape)), tm.strides(), list(reversed(tm.box)))
    if got != want:
        raise AssertionError(f"the library encoded the tensor map {got}; the kernel reads {want}")


class _OnDevice:
    """A host array posing as a device array (the stand-in's device memory is host memory)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str,
                                         "data": (a.ctypes.data, False), "version": 3}


def gather_model() -> Any:
    """A Gather: its kernel checks each index and reports through the status word."""
    from onnx import TensorProto, helper

    d = helper.make_tensor_value_info("d", TensorProto.FLOAT, [5, 3])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])
    node = helper.make_node("Gather", ["d", "i"], ["y"], name="pick")
    return helper.make_model(helper.make_graph([node], "g", [d, i], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


def matmul_model(m: int = 768, k: int = 64, n: int = 1024) -> Any:
    """relu(X) @ relu(Y): in fp16 on sm_90, two half intermediates multiplied in 48 blocks of
    128 x 128, a wgmma main loop copying by TMA."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [k, n])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [m, n])
    nodes = [helper.make_node("Relu", ["x"], ["rx"]), helper.make_node("Relu", ["y"], ["ry"]),
             helper.make_node("MatMul", ["rx", "ry"], ["z"])]
    return helper.make_model(helper.make_graph(nodes, "mm", [x, y], [z]),
                             opset_imports=[helper.make_opsetid("", 17)])


def views_model() -> Any:
    """Outputs that no kernel writes in place: a reshape of another output, and the input."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([6, 5], np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["flat"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("flat", "r", "x")]
    return helper.make_model(helper.make_graph(nodes, "views", [x], outs, [shape]),
                             opset_imports=[helper.make_opsetid("", 17)])


def _max_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    assert [g.shape for g in got] == [w.shape for w in want]
    errors = [np.abs(g.astype(np.float64) - w) for g, w in zip(got, want)]
    return max(float(np.max(np.nan_to_num(e, nan=np.inf))) for e in errors)  # NaN: unwritten


def main(model: str, archs: str, folder: Path, gpus: list[tuple[int, ...]],
         weights_file: bool = False) -> list[dict]:
    """Compile ``model`` (small_cnn, gather, views, resnet18, matmul_fp16) for ``archs``, export it to
    ``folder`` (its weights in a weights file when ``weights_file``), and run it over the
    stand-in driver posing as each of ``gpus`` in turn
    ((compute capability, bytes it can allocate or -1[, 0: it cannot record graphs])): the
    host path on two inputs, and the device-pointer path from inputs I0 and I1 into outputs O0
    and O1 (DEVICE_RUNS), against onnxruntime. A report per GPU: {"create": the load error or "", "host" /
    "device": max abs error over those runs, "archs": code that ran, "launches", "errors",
    "live": what destroy left, and the driver's counts GRAPH_STATS}."""
    import gc

    import autosched as aus
    from autosched.errors import ModelImportError, RuntimeError_
    from autosched.graph.deploy import export
    from autosched.targets.cuda.library import cuda_module, library_archs
    from autosched.testing.models import ort_run, resnet18, small_cnn
    from importers.onnx import from_onnx

    if model == "small_cnn_dynamic":  # every shared buffer carved out of dynamic memory
        from autosched.targets.cuda import codegen

        codegen.STATIC_SHARED_BYTES = 0
    proto = {"small_cnn": lambda: small_cnn(image=11), "gather": gather_model,
             "small_cnn_dynamic": lambda: small_cnn(image=11),
             "resnet18": lambda: resnet18(image=32),
             "views": views_model, "matmul_fp16": matmul_model}[model]()
    options = {"precision": "fp16", "schedule": "default"} if model == "matmul_fp16" else {}
    if model == "matmul_fp16":
        os.environ["AUTOSCHED_TMA"] = "1"
    compiled = aus.compile(from_onnx(proto), target=f"cuda -arch={archs} -emulate=ir",
                           **options)
    export(compiled, folder / "build", name=model, weights_file=weights_file)
    mock = ctypes.CDLL(str(build_mock(folder)), mode=ctypes.RTLD_GLOBAL)
    modules = list({id(m): m for m in (cuda_module(k.module) for k in compiled.kernels)}.values())
    rng = np.random.default_rng()
    feeds = [{v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype)
              for v in compiled.graph.inputs} for _ in range(2)]
    if model == "gather":
        feeds[0]["i"], feeds[1]["i"] = np.array([0, 4, 1, 2]), np.array([3, 3, 0, 1])
    want = [ort_run(proto, f) for f in feeds]
    reports = []
    for cc, memory, *graphs in gpus:
        emulator = Emulator(modules, library_archs(compiled.target))
        mock.mock_configure(cc, 1, ctypes.c_longlong(memory), emulator.callback)
        mock.mock_graphs(graphs[0] if graphs else 1, emulator.counter)
        report: dict[str, Any] = {"create": "", "errors": emulator.errors}
        try:
            deployed = aus.load(folder / "build")
        except ModelImportError as exc:
            report["create"] = str(exc)
        else:
            report["host"] = max(_max_error(deployed.run(f), w) for f, w in zip(feeds, want))
            ins = [{k: _OnDevice(v) for k, v in f.items()} for f in feeds]
            outs = [[np.empty(w.shape, w.dtype) for w in want[0]] for _ in range(2)]
            report["device"] = max(_run_device(deployed, ins[i], outs[o], want[i])
                                   for i, o in DEVICE_RUNS)
            if model == "gather":
                try:
                    deployed.run({"d": feeds[0]["d"], "i": np.array([0, 1, 9, 2])})
                except RuntimeError_ as exc:
                    report["bad_index"] = str(exc)
                report["after_bad_index"] = _max_error(deployed.run(feeds[1]), want[1])
            del deployed
        gc.collect()
        stats = (ctypes.c_int * len(GRAPH_STATS))()
        mock.mock_graph_stats(stats)
        report.update(archs=sorted(emulator.archs), launches=emulator.launches,
                      live=mock.mock_live(), opted_in=mock.mock_opted_in(),
                      **dict(zip(GRAPH_STATS, stats)))
        reports.append(report)
    return reports


def _run_device(deployed: Any, inputs: dict[str, _OnDevice], outs: list[np.ndarray],
                want: list[np.ndarray]) -> float:
    """run_device from ``inputs`` into ``outs`` (filled with NaN first); the max abs error."""
    for o in outs:
        o.fill(np.nan if o.dtype.kind == "f" else -1)
    deployed.run_device(inputs, [_OnDevice(o) for o in outs])
    return _max_error(outs, want)


if __name__ == "__main__":
    model, archs, folder, *gpus = [a for a in sys.argv[1:] if a != "--weights-file"]
    print(json.dumps(main(model, archs, Path(folder),
                          [tuple(map(int, g.split(":"))) for g in gpus],  # type: ignore[misc]
                          "--weights-file" in sys.argv)))
