"""A compiled CUDA model as one shared library with the C API of targets/model_api.py.

``build_library(spec, path)`` writes the glue of ``spec`` (a LibrarySpec whose calls run CUDA
modules) as C and compiles it with the host C compiler into ``path``, which holds:

* a cubin of every kernel module for each arch the target lists (``cuda -arch=sm_80,sm_90``;
  PTX where this NVRTC cannot write machine code for one), chosen at create by the GPU's
  compute capability: a cubin of the same major and the highest minor not above the GPU's, else
  PTX for an arch not above it; none fits: the DEVICE status, naming the GPU's arch;
* the weights (or, built with ``spec.weights_file``, the header of ``NAME.weights``, which
  create maps, checks as the CPU library does and unmaps once uploaded: see WEIGHTS_FILE),
  uploaded at create, and the static memory plan: one device allocation per
  context holding the weights, the workspace, each module's scratch buffers, the kernels' status
  word and the host path's copies of the inputs and outputs;
* the call order: each launch's function, grid, block and where each argument lives.

The library loads ``libcuda.so.1`` with ``dlopen`` at the first create and finds the driver
functions with ``dlsym``: it links no CUDA library (no cudart, no libcuda), only libc (and libdl
where libc lacks ``dlopen``), so it loads on a machine without a GPU and fails there with a
status. Only the API is exported (``-fvisibility=hidden`` and a version script). ``run`` takes
host pointers (copies in, launches, copies out, waits for the stream); ``run_device`` takes
device pointers and queues the same launches on the context's stream without waiting (unless
some kernel checks indices: then it waits to read their status word).

The launches of a run (with the clearing of the status word and the output copies between
device buffers) are one CUDA graph: recorded the first time on a private non-blocking stream
(the legacy default stream cannot record, and a blocking stream's recording would break when
another thread used the legacy one meanwhile), then launched on the context's stream (the
user's, or the legacy default one): one driver call per run instead of one per kernel. The
status word is read, and the host copies made, outside the graph. The host path's graph is
recorded once (its inputs and outputs are the context's staging buffers); the device path's
again whenever a run is given other pointers than the ones recorded, and its executable graph
is then updated in place (``cuGraphExecUpdate``: only kernel arguments and copy addresses
differ, so the update takes the place of a new instantiation, which costs more; a driver
before CUDA 12 instantiates anew). A driver without graphs (before CUDA 11.4), or one that
fails to record them, gets the launches one by one, as does a library compiled with
``-DCUDA_GRAPHS=0`` (build_library's ``flags``: benchmarks compare both).

Example::

    spec = library_spec(model, "net", static=False)    # graph/deploy.py; export does all this
    built = build_library(spec, "build/net/net.so")
    Path("build/net/net.h").write_text(built.header)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from autosched.errors import CompileError
from autosched.targets.cuda.codegen import arch_number
from autosched.targets.cuda.tma import DATA_TYPES, ENCODE_OPTIONS, TensorMap
from autosched.targets.cuda.wgmma import ARCH as WGMMA_ARCH
from autosched.targets.model_api import (
    API,
    DEVICE_API,
    HASH_MIX,
    HASH_STEP,
    STATUS_MESSAGES,
    STATUS_OK,
    WEIGHTS_CHECKS,
    WEIGHTS_DETAIL_BYTES,
    WEIGHTS_FAILURES,
    WEIGHTS_HEADER_BYTES,
    WEIGHTS_PATH_MAX,
    Status,
    padded_weights,
    weights_header,
)
from autosched.targets.model_api import header as api_header
from autosched.targets.target import Target, parse
from autosched.tir import ir
from autosched.tir.evaluate import eval_int

ALIGN = 256  # cuMemAlloc's alignment: the workspace and each staging buffer start on it
REGIONS = {"input": "IN", "output": "OUT", "weights": "WEIGHTS", "workspace": "WORK"}
DRIVER_FUNCTIONS = (  # (field of the C driver table, symbol in libcuda.so.1, C signature)
    ("Init", "cuInit", "(unsigned int)"),
    ("DeviceGetCount", "cuDeviceGetCount", "(int *)"),
    ("DeviceGet", "cuDeviceGet", "(CUdevice *, int)"),
    ("DeviceGetAttribute", "cuDeviceGetAttribute", "(int *, int, CUdevice)"),
    ("PrimaryCtxRetain", "cuDevicePrimaryCtxRetain", "(CUcontext *, CUdevice)"),
    ("PrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", "(CUdevice)"),
    ("CtxPush", "cuCtxPushCurrent_v2", "(CUcontext)"),
    ("CtxPop", "cuCtxPopCurrent_v2", "(CUcontext *)"),
    ("ModuleLoadData", "cuModuleLoadData", "(CUmodule *, const void *)"),
    ("ModuleUnload", "cuModuleUnload", "(CUmodule)"),
    ("ModuleGetFunction", "cuModuleGetFunction", "(CUfunction *, CUmodule, const char *)"),
    ("FuncSetAttribute", "cuFuncSetAttribute", "(CUfunction, int, int)"),
    ("MemAlloc", "cuMemAlloc_v2", "(CUdeviceptr *, size_t)"),
    ("MemFree", "cuMemFree_v2", "(CUdeviceptr)"),
    ("HtoD", "cuMemcpyHtoDAsync_v2", "(CUdeviceptr, const void *, size_t, CUstream)"),
    ("DtoH", "cuMemcpyDtoHAsync_v2", "(void *, CUdeviceptr, size_t, CUstream)"),
    ("DtoD", "cuMemcpyDtoDAsync_v2", "(CUdeviceptr, CUdeviceptr, size_t, CUstream)"),
    ("MemsetD32", "cuMemsetD32Async", "(CUdeviceptr, unsigned int, size_t, CUstream)"),
    ("Launch", "cuLaunchKernel", "(CUfunction, unsigned int, unsigned int, unsigned int, "
     "unsigned int, unsigned int, unsigned int, unsigned int, CUstream, void **, void **)"),
    ("StreamSynchronize", "cuStreamSynchronize", "(CUstream)"),
    ("GetErrorName", "cuGetErrorName", "(CUresult, const char **)"),
)
# The driver functions that capture a run's launches as a CUDA graph and replay it (CUDA 11.4;
# cuGraphExecUpdate_v2: 12.0). A driver without them runs the same launches one by one.
GRAPH_FUNCTIONS = (
    ("StreamCreate", "cuStreamCreate", "(CUstream *, unsigned int)"),
    ("StreamDestroy", "cuStreamDestroy_v2", "(CUstream)"),
    ("BeginCapture", "cuStreamBeginCapture_v2", "(CUstream, int)"),
    ("EndCapture", "cuStreamEndCapture", "(CUstream, CUgraph *)"),
    ("GraphInstantiate", "cuGraphInstantiateWithFlags",
     "(CUgraphExec *, CUgraph, unsigned long long)"),
    ("GraphLaunch", "cuGraphLaunch", "(CUgraphExec, CUstream)"),
    ("GraphExecDestroy", "cuGraphExecDestroy", "(CUgraphExec)"),
    ("GraphDestroy", "cuGraphDestroy", "(CUgraph)"),
)
GRAPH_UPDATE = ("GraphExecUpdate", "cuGraphExecUpdate_v2", "(CUgraphExec, CUgraph, update_info *)")
# TMA descriptors (CUDA 12.0), for kernels whose main loops copy by TMA (tma.py); a driver
# without it fails the first run of such a library, naming the call
TMA_ENCODE = ("TensorMapEncodeTiled", "cuTensorMapEncodeTiled",
              "(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *, "
              "const uint32_t *, const uint32_t *, int, int, int, int)")


def cuda_module(module: Any) -> Any:
    """The CudaModule of a graph kernel's module (itself, or the one a host emulation wraps);
    CompileError for any other."""
    from autosched.targets.cuda.host_emulate import EmulatedModule
    from autosched.targets.cuda.runtime import CudaModule

    if isinstance(module, EmulatedModule):
        module = module.module
    if not isinstance(module, CudaModule):
        raise CompileError(f"a CUDA model library holds CUDA kernels; {module!r} is not one")
    if module.source.shape_vars:
        raise CompileError(f"kernel {module.func.name} has symbolic sizes "
                           f"{[v.name for v in module.source.shape_vars]}; a model library "
                           "needs static shapes")
    return module


def library_archs(target: Target) -> tuple[str, ...]:
    """The archs a library for ``target`` holds code for: ``-arch=sm_80,sm_90``, or the one
    arch of the target."""
    listed = tuple(a for a in target.option("arch").split(",") if a)
    return tuple(dict.fromkeys(listed)) or (target.arch,)


def deployed_target(target: Target) -> Target:
    """``target`` as the library reports it: without host emulation (a library built from an
    emulated model on a machine without a GPU runs on the GPU), with the arch it detected."""
    options = [(k, v) for k, v in target.options if k != "emulate"]
    if "arch" not in dict(options):
        options.append(("arch", target.arch))
    return parse(" ".join([target.kind, *(f"-{k}={v}" if v else f"-{k}" for k, v in options)]))


def host_compiler() -> str:
    """The host C compiler (``cc``, else ``gcc``); CompileError when there is none."""
    for name in ("cc", "gcc"):
        found = shutil.which(name)
        if found:
            return found
    raise CompileError("building a CUDA model library needs a host C compiler (cc or gcc) on "
                       "PATH; none was found (install gcc)")


class Built(NamedTuple):
    """A library written: its header's text and the target it reports."""

    header: str
    target: str


def build_library(spec: Any, path: str | os.PathLike, flags: tuple[str, ...] = ()) -> Built:
    """Compile ``spec`` into the shared library ``path``; ``flags`` go to the compiler (tests
    add ``-Werror``). The C source includes the header it returns, so the compiler checks
    each definition against its declaration."""
    plan = _Plan(spec)
    header = api_header(spec.name, [(t.name, t.dtype, t.shape) for t in spec.inputs],
                        [(t.name, t.dtype, t.shape) for t in spec.outputs], str(plan.target),
                        gpu=True, run_device_waits=plan.checks)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "weights.bin").write_bytes(b"" if spec.weights_file else spec.weights)
        (d / "code.bin").write_bytes(plan.code)
        (d / f"{spec.name}.h").write_text(header)
        src = d / f"{spec.name}.c"
        src.write_text(c_source(spec, plan, d))
        exports = d / "exports.map"
        names = "; ".join(f"{spec.name}_{a}" for a in (*API, *DEVICE_API))
        exports.write_text(f"{{ global: {names}; local: *; }};\n")
        cmd = [host_compiler(), "-shared", "-fPIC", "-O2", "-std=gnu11", "-Wall", "-Wextra",
               "-fvisibility=hidden", *flags, f"-I{d}", "-o", os.fspath(path), os.fspath(src),
               f"-Wl,--version-script={exports}", "-Wl,--as-needed", "-ldl", "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"compiling the CUDA model library failed: {' '.join(cmd)}\n"
                               f"{proc.stdout}{proc.stderr}")
    return Built(header, str(plan.target))


# -- the plan: what the C tables hold -----------------------------------------------------------

@dataclass(frozen=True)
class _Launch:
    function: int
    grid: tuple[int, ...]
    block: tuple[int, ...]
    # (region, byte offset or pointer index, 0 or 1 + the index of the tensor map whose
    # descriptor the argument is: _Plan.tensor_maps)
    args: tuple[tuple[str, int, int], ...]


class _Plan:
    """The modules, functions, launches, code and device memory layout of a spec."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.target = deployed_target(spec.target)
        self.modules: list[Any] = []
        for call in spec.calls:
            m = cuda_module(call.module)
            if all(m is not k for k in self.modules):
                self.modules.append(m)
        at = _aligned(spec.workspace)
        self.scratch: dict[tuple[int, str], int] = {}
        for n, m in enumerate(self.modules):  # buffers a module's kernels pass between them
            for buf in m.source.workspace:
                self.scratch[(n, buf.name)] = at
                at = _aligned(at + _nbytes(buf))
        self.checks = any(m.checks for m in self.modules)
        self.status_at = at
        at += ALIGN
        self.stage_in: list[int] = []
        self.stage_out: list[int] = []
        for tensors, stage in ((spec.inputs, self.stage_in), (spec.outputs, self.stage_out)):
            for t in tensors:
                stage.append(at)
                at = _aligned(at + _tensor_bytes(t))
        self.workspace = at
        self.functions: list[tuple[int, str]] = [
            (n, k.name) for n, m in enumerate(self.modules) for k in m.source.kernels]
        self.function_shared = [k.dynamic_shared for m in self.modules for k in m.source.kernels]
        self.tensor_maps: list[TensorMap] = []
        self.launches = [launch for call in spec.calls for launch in self._launches(call)]
        self.archs, self.code, self.spans = self._binaries()

    def _index(self, module: Any) -> int:
        return next(n for n, m in enumerate(self.modules) if m is module)

    def _launches(self, call: Any) -> list[_Launch]:
        m = cuda_module(call.module)
        n = self._index(m)
        params = list(m.func.params)
        out = []
        for info in m.source.kernels:
            grid = tuple(eval_int(e, {}) for e in info.grid)
            block = tuple(eval_int(e, {}) for e in info.block)
            if 0 in grid or 0 in block:
                continue
            args = []
            for buf, map_at in [*((b, self._map_index(tm)) for b, tm in info.tensor_maps),
                                *((b, 0) for b in info.buffers)]:
                if buf in params:
                    place = call.args[params.index(buf)]
                    if place.region not in REGIONS:
                        raise CompileError(f"kernel {info.name}: argument {buf.name} lives in "
                                           f"{place.region}, which a library cannot hold")
                    args.append((place.region, place.at, map_at))
                else:
                    args.append(("workspace", self.scratch[(n, buf.name)], map_at))
            if info.checks:
                args.append(("workspace", self.status_at, 0))
            function = self.functions.index((n, info.name))
            out.append(_Launch(function, grid, block, tuple(args)))
        return out

    def _map_index(self, tm: TensorMap) -> int:
        """1 + the index of ``tm`` in the library's table of tensor maps."""
        if tm not in self.tensor_maps:
            self.tensor_maps.append(tm)
        return 1 + self.tensor_maps.index(tm)

    def _binaries(self) -> tuple[list[tuple[int, bool]], bytes, list[list[tuple[int, int]]]]:
        """Each arch's (compute capability, whether PTX), the code blob and each (arch, module)
        binary's (offset, size) in it."""
        from autosched.targets.cuda import nvrtc_options
        from autosched.targets.cuda.nvrtc import compile_cuda

        blob = bytearray()
        archs, spans = [], []
        for arch in library_archs(self.target):
            row = []
            kind = ""
            for m in self.modules:
                if m.source.arch_specific and arch_number(arch) != WGMMA_ARCH:
                    raise CompileError(f"{m.func.name} runs on wgmma, which only sm_90 has; "
                                       f"the library also targets {arch}")
                binary = compile_cuda(m.source.code, arch + "a" * m.source.arch_specific,
                                      nvrtc_options(self.target),
                                      needs_headers=m.source.uses_half, name=f"{m.func.name}.cu")
                data = binary.data + (b"\0" if binary.kind == "ptx" else b"")
                blob += bytes(-len(blob) % 64)
                row.append((len(blob), len(data)))
                blob += data
                kind = binary.arch
            spans.append(row)
            archs.append((arch_number(kind), kind.startswith("compute_")))
        return archs, bytes(blob), spans


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _nbytes(buf: ir.Buffer) -> int:
    n = buf.itemsize
    for d in buf.shape:
        n *= eval_int(d, {})
    return max(n, 1)


def _tensor_bytes(t: Any) -> int:
    from autosched.te import dtype as dt

    n = dt.nbytes(t.dtype)
    for d in t.shape:
        n *= d
    return max(n, 1)


# -- the C source -------------------------------------------------------------------------------

def c_string(text: str) -> str:
    """``text`` as a C string literal (UTF-8; quotes, backslashes, ``?`` and non-printable
    bytes as octal escapes)."""
    out = []
    for b in text.encode():
        out.append(chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _array(ctype: str, name: str, rows: list[str], empty: str = "{0}") -> str:
    """A static const C array; an empty one gets the row ``empty`` (C has no empty arrays)."""
    body = ",\n  ".join(rows or [empty])
    return f"static const {ctype} {name}[] = {{\n  {body}\n}};"


def _blob(symbol: str, path: Path) -> str:
    """The file ``path`` embedded read-only as the hidden symbol ``symbol`` (.incbin: a model's
    weights are megabytes, too many for a C initialiser)."""
    text = os.fspath(path)
    if any(c in text for c in '"\\\n'):
        raise CompileError(f"temporary directory {text!r} has a character .incbin cannot quote")
    return (f'__asm__(".section .rodata\\n.balign 64\\n.globl {symbol}\\n.hidden {symbol}\\n'
            f'{symbol}:\\n.incbin \\"{text}\\"\\n.byte 0\\n.previous\\n");\n'
            f'extern const unsigned char {symbol}[] __attribute__((visibility("hidden")));')


# What does not change between models: loading the driver, contexts, runs, introspection
# (@name@: the model's name; the tables come first, from c_source).
GLUE = r"""
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static char cu_failure[256]; /* why the driver cannot be used; empty when it can */
static char detail[DETAIL_BYTES]; /* the last DEVICE, DRIVER or WEIGHTS failure's message */

static void note(const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(detail, sizeof detail, format, args);
  va_end(args);
}

static const char *error_name(CUresult r) {
  const char *name = NULL;
  if (cu.GetErrorName) cu.GetErrorName(r, &name);
  return name ? name : "an unknown CUDA error";
}

static int32_t failed(const char *call, CUresult r) {
  note(MODEL ": %s failed: %s", call, error_name(r));
  return r == CU_OUT_OF_MEMORY ? ST_ALLOC | ST_DRIVER : ST_DRIVER;
}

static void load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(cu_failure, sizeof cu_failure, "no CUDA driver (libcuda.so.1): %s", dlerror());
    return;
  }
  for (size_t i = 0; i < sizeof SYMBOLS / sizeof *SYMBOLS; i++) {
    void *f = dlsym(lib, SYMBOLS[i].name);
    if (!f && !SYMBOLS[i].required) continue; /* a graph function: runs launch one by one */
    if (!f) {
      snprintf(cu_failure, sizeof cu_failure, "the CUDA driver lacks %s (too old)",
               SYMBOLS[i].name);
      return;
    }
    memcpy((char *)&cu + SYMBOLS[i].at, &f, sizeof f);
  }
  CUresult r = cu.Init(0);
  if (r) snprintf(cu_failure, sizeof cu_failure, "cuInit failed: %s", error_name(r));
}

/* The code for compute capability major.minor: a cubin of the same major and the highest minor
   not above it, else PTX for the highest arch not above it; -1 when none fits. */
static int pick_arch(int major, int minor) {
  int best = -1, best_ptx = -1, cc = major * 10 + minor;
  for (int a = 0; a < N_ARCHS; a++) {
    if (!ARCHS[a].ptx && ARCHS[a].cc / 10 == major && ARCHS[a].cc <= cc &&
        (best < 0 || ARCHS[a].cc > ARCHS[best].cc)) best = a;
    if (ARCHS[a].ptx && ARCHS[a].cc <= cc && (best_ptx < 0 || ARCHS[a].cc > ARCHS[best_ptx].cc))
      best_ptx = a;
  }
  return best >= 0 ? best : best_ptx;
}

/* -- contexts ---------------------------------------------------------------------------- */

/* A run's launches recorded as a graph, with the input and output pointers they were given. */
typedef struct {
  CUgraphExec exec;
  CUdeviceptr bound[N_INPUTS + N_OUTPUTS + 1];
} run_graph;
enum { HOST_GRAPH, DEVICE_GRAPH }; /* run's (staging buffers) and run_device's */

struct @name@_context {
  CUcontext cuda;
  CUdevice device;
  CUstream stream;
  int arch;
  CUdeviceptr memory; /* the weights, then the workspace */
  CUmodule modules[N_MODULES];
  CUfunction functions[N_FUNCTIONS];
  int use_graphs;     /* replay graphs; 0 once recording one failed: launches one by one */
  CUstream recording; /* the private stream graphs are recorded on, made at the first */
  run_graph graph[2];
};

/* Frees what create made, once the stream is done with it; the caller has made the context's
   CUDA context current. */
static void release(struct @name@_context *c) {
  cu.StreamSynchronize(c->stream);
  for (int g = 0; g < 2; g++)
    if (c->graph[g].exec) cu.GraphExecDestroy(c->graph[g].exec);
  if (c->recording) cu.StreamDestroy(c->recording);
  for (int m = 0; m < N_MODULES; m++)
    if (c->modules[m]) cu.ModuleUnload(c->modules[m]);
  if (c->memory) cu.MemFree(c->memory);
}

static int32_t setup(struct @name@_context *c, const unsigned char *weights) {
  CUresult r = cu.MemAlloc(&c->memory, MEMORY_BYTES);
  if (r) return failed("cuMemAlloc of the weights and workspace", r);
  if (WEIGHTS_BYTES && (r = cu.HtoD(c->memory, weights, WEIGHTS_BYTES, c->stream)))
    return failed("uploading the weights", r);
  for (int m = 0; m < N_MODULES; m++)
    if ((r = cu.ModuleLoadData(&c->modules[m], @name@__code + CODE[c->arch][m].at)))
      return failed("cuModuleLoadData", r);
  for (int f = 0; f < N_FUNCTIONS; f++)
    if ((r = cu.ModuleGetFunction(&c->functions[f], c->modules[FUNCTION_MODULE[f]],
                                  FUNCTION_NAME[f])))
      return failed("cuModuleGetFunction", r);
  for (int f = 0; f < N_FUNCTIONS; f++)  /* over 48 KB of shared memory: opt in */
    if (FUNCTION_SHARED[f] && (r = cu.FuncSetAttribute(c->functions[f],
                                                      FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                      (int)FUNCTION_SHARED[f])))
      return failed("cuFuncSetAttribute (dynamic shared memory)", r);
  if ((r = cu.StreamSynchronize(c->stream))) return failed("uploading the weights", r);
  return ST_OK;
}

/* create, given the weights in host memory */
static int32_t create_on(const @name@_options *options, @name@_context **context,
                         const unsigned char *weights) {
  pthread_once(&cu_once, load_driver);
  if (cu_failure[0]) {
    note(MODEL ": %s", cu_failure);
    return ST_DEVICE;
  }
  int ordinal = options ? options->device : 0, count = 0, major = 0, minor = 0;
  CUresult r = cu.DeviceGetCount(&count);
  if (r || ordinal < 0 || ordinal >= count) {
    note(MODEL ": no CUDA device %d (this machine has %d)", ordinal, count);
    return ST_DEVICE;
  }
  CUdevice device;
  if ((r = cu.DeviceGet(&device, ordinal)) ||
      (r = cu.DeviceGetAttribute(&major, CC_MAJOR, device)) ||
      (r = cu.DeviceGetAttribute(&minor, CC_MINOR, device)))
    return failed("cuDeviceGet", r);
  int a = pick_arch(major, minor);
  if (a < 0) {
    note(MODEL ": GPU %d is sm_%d%d; this library holds code for %s only (compile the model "
         "with -arch=sm_%d%d)", ordinal, major, minor, ARCH_NAMES, major, minor);
    return ST_DEVICE;
  }
  struct @name@_context *c = calloc(1, sizeof *c);
  if (!c) return ST_ALLOC;
  c->device = device;
  c->stream = options ? (CUstream)options->stream : NULL;
  c->arch = a;
  c->use_graphs = CUDA_GRAPHS && HAS_GRAPHS;
  if ((r = cu.PrimaryCtxRetain(&c->cuda, device))) {
    free(c);
    return failed("cuDevicePrimaryCtxRetain", r);
  }
  CUcontext popped;
  int32_t status = (r = cu.CtxPush(c->cuda)) ? failed("cuCtxPushCurrent", r) : setup(c, weights);
  if (!r) {
    if (status) release(c);
    cu.CtxPop(&popped);
  }
  if (status) {
    cu.PrimaryCtxRelease(device);
    free(c);
    return status;
  }
  *context = c;
  return ST_OK;
}

API int32_t @name@_create(const @name@_options *options, @name@_context **context) {
  if (!context) return ST_ARGUMENT;
  *context = NULL;
  const unsigned char *mapped = NULL;
  size_t length = 0;
  int32_t status = open_weights(options ? options->weights_path : NULL, &mapped, &length);
  if (status) return status;
  status = create_on(options, context, mapped + WEIGHTS_AT);
  close_weights(mapped, length); /* uploaded: the device holds them now */
  return status;
}

API void @name@_destroy(@name@_context *c) {
  if (!c) return;
  CUcontext popped;
  if (!cu.CtxPush(c->cuda)) {
    release(c);
    cu.CtxPop(&popped);
  }
  cu.PrimaryCtxRelease(c->device);
  free(c);
}

/* -- runs -------------------------------------------------------------------------------- */

static CUdeviceptr address(const struct @name@_context *c, place p, const CUdeviceptr *in,
                           const CUdeviceptr *out) {
  switch (p.region) {
    case IN: return in[p.at];
    case OUT: return out[p.at];
    case WEIGHTS: return c->memory + p.at;
    default: return c->memory + WORK_AT + p.at;
  }
}

/* The launches and copies of one run on stream, not waiting for them. */
static int32_t enqueue(struct @name@_context *c, CUstream stream, const CUdeviceptr *in,
                       const CUdeviceptr *out) {
  static const uint32_t ones[5] = {1, 1, 1, 1, 1};
  CUdeviceptr values[MAX_ARGS];
  descriptor maps[MAX_ARGS];
  void *params[MAX_ARGS];
  CUresult r;
  if (CHECKS && (r = cu.MemsetD32(c->memory + WORK_AT + STATUS_AT, 0, 1, stream)))
    return failed("clearing the status word", r);
  for (int l = 0; l < N_LAUNCHES; l++) {
    const launch *k = &LAUNCHES[l];
    for (uint32_t j = 0; j < k->count; j++) {
      const place p = ARGS[k->first + j];
      values[j] = address(c, p, in, out);
      params[j] = &values[j];
      if (!p.map) continue;
      const tensor_map *t = &TENSOR_MAPS[p.map - 1];
      if (!cu.TensorMapEncodeTiled) return failed("cuTensorMapEncodeTiled (CUDA 12)", 500);
      if ((r = cu.TensorMapEncodeTiled(&maps[j], t->dtype, t->rank, (void *)(uintptr_t)values[j],
                                       t->dims, t->strides, t->box, ones, TMA_OPTIONS)))
        return failed("cuTensorMapEncodeTiled", r);
      params[j] = &maps[j];
    }
    r = cu.Launch(c->functions[k->function], k->grid[0], k->grid[1], k->grid[2], k->block[0],
                  k->block[1], k->block[2], FUNCTION_SHARED[k->function], stream, params, NULL);
    if (r) {
      note(MODEL ": launching kernel %s (launch %d of %d) failed: %s", FUNCTION_NAME[k->function],
           l + 1, N_LAUNCHES, error_name(r));
      return r == CU_OUT_OF_MEMORY ? ST_ALLOC | ST_DRIVER : ST_DRIVER;
    }
  }
  for (int k = 0; k < N_COPIES; k++)
    if ((r = cu.DtoD(out[COPIES[k].output], address(c, COPIES[k].src, in, out),
                     COPIES[k].nbytes, stream)))
      return failed("copying an output", r);
  return ST_OK;
}

/* Records the launches of a run on in and out into g: a new executable graph, or g's updated
   to the new arguments. Nonzero when the driver cannot record or instantiate it. */
static int record(struct @name@_context *c, run_graph *g, const CUdeviceptr *in,
                  const CUdeviceptr *out) {
  CUgraph recorded = NULL;
  if (!c->recording && cu.StreamCreate(&c->recording, STREAM_NON_BLOCKING)) return 1;
  if (cu.BeginCapture(c->recording, CAPTURE_THREAD_LOCAL)) return 1;
  int32_t status = enqueue(c, c->recording, in, out);
  if (cu.EndCapture(c->recording, &recorded) || status || !recorded) {
    if (recorded) cu.GraphDestroy(recorded);
    return 1;
  }
  update_info info;
  if (g->exec && !(cu.GraphExecUpdate && !cu.GraphExecUpdate(g->exec, recorded, &info))) {
    cu.GraphExecDestroy(g->exec);
    g->exec = NULL;
  }
  CUresult r = g->exec ? 0 : cu.GraphInstantiate(&g->exec, recorded, 0);
  cu.GraphDestroy(recorded); /* the executable graph is a copy */
  if (r) {
    g->exec = NULL;
    return 1;
  }
  memcpy(g->bound, in, N_INPUTS * sizeof *in);
  memcpy(g->bound + N_INPUTS, out, N_OUTPUTS * sizeof *out);
  return 0;
}

/* One run's launches on the context's stream: graph g, recorded first when it is not bound
   to in and out, or, without graphs, each launch. */
static int32_t dispatch(struct @name@_context *c, int which, const CUdeviceptr *in,
                        const CUdeviceptr *out) {
  run_graph *g = &c->graph[which];
  int bound = g->exec && !memcmp(g->bound, in, N_INPUTS * sizeof *in) &&
              !memcmp(g->bound + N_INPUTS, out, N_OUTPUTS * sizeof *out);
  if (c->use_graphs && !bound && record(c, g, in, out)) c->use_graphs = 0;
  if (!c->use_graphs) return enqueue(c, c->stream, in, out);
  CUresult r = cu.GraphLaunch(g->exec, c->stream);
  return r ? failed("cuGraphLaunch", r) : ST_OK;
}

/* Waits for the stream; the kernels' status word, or the driver's failure. */
static int32_t finish(struct @name@_context *c) {
  int32_t word = 0;
  CUresult r;
  if (CHECKS && (r = cu.DtoH(&word, c->memory + WORK_AT + STATUS_AT, 4, c->stream)))
    return failed("reading the status word", r);
  if ((r = cu.StreamSynchronize(c->stream))) return failed("running the kernels", r);
  return word;
}

API int32_t @name@_run(@name@_context *c, const void *const *inputs, void *const *outputs) {
  if (!c || !inputs || !outputs) return ST_ARGUMENT;
  CUdeviceptr in[N_INPUTS + 1], out[N_OUTPUTS + 1];
  for (int i = 0; i < N_INPUTS; i++) {
    if (!inputs[i]) return ST_ARGUMENT;
    in[i] = c->memory + WORK_AT + STAGE_IN[i];
  }
  for (int o = 0; o < N_OUTPUTS; o++) {
    if (!outputs[o]) return ST_ARGUMENT;
    out[o] = c->memory + WORK_AT + STAGE_OUT[o];
  }
  CUcontext popped;
  CUresult r = cu.CtxPush(c->cuda);
  if (r) return failed("cuCtxPushCurrent", r);
  int32_t status = ST_OK;
  for (int i = 0; i < N_INPUTS && !status; i++)
    if ((r = cu.HtoD(in[i], inputs[i], INPUT_BYTES[i], c->stream)))
      status = failed("copying an input to the GPU", r);
  if (!status) status = dispatch(c, HOST_GRAPH, in, out);
  for (int o = 0; o < N_OUTPUTS && !status; o++)
    if ((r = cu.DtoH(outputs[o], out[o], OUTPUT_BYTES[o], c->stream)))
      status = failed("copying an output from the GPU", r);
  if (!status) status = finish(c);
  cu.CtxPop(&popped);
  return status;
}

API int32_t @name@_run_device(@name@_context *c, const void *const *inputs, void *const *outputs) {
  if (!c || !inputs || !outputs) return ST_ARGUMENT;
  CUdeviceptr in[N_INPUTS + 1], out[N_OUTPUTS + 1];
  for (int i = 0; i < N_INPUTS; i++) {
    in[i] = (CUdeviceptr)(uintptr_t)inputs[i];
    if (!in[i] || in[i] % 16) return ST_ARGUMENT;
  }
  for (int o = 0; o < N_OUTPUTS; o++) {
    out[o] = (CUdeviceptr)(uintptr_t)outputs[o];
    if (!out[o] || out[o] % 16) return ST_ARGUMENT;
  }
  CUcontext popped;
  CUresult r = cu.CtxPush(c->cuda);
  if (r) return failed("cuCtxPushCurrent", r);
  int32_t status = dispatch(c, DEVICE_GRAPH, in, out);
  if (!status && CHECKS) status = finish(c);
  cu.CtxPop(&popped);
  return status;
}

/* -- introspection ----------------------------------------------------------------------- */

API int32_t @name@_num_inputs(void) { return N_INPUTS; }
API int32_t @name@_num_outputs(void) { return N_OUTPUTS; }
API const @name@_tensor_info *@name@_input(int32_t i) {
  return i >= 0 && i < N_INPUTS ? &INPUTS[i] : NULL;
}
API const @name@_tensor_info *@name@_output(int32_t i) {
  return i >= 0 && i < N_OUTPUTS ? &OUTPUTS[i] : NULL;
}
API const char *@name@_target(void) { return TARGET; }
API const char *@name@_version(void) { return VERSION; }

/* The lowest bit's message; a DEVICE or DRIVER failure's says which call and why. */
API const char *@name@_status_message(int32_t status) {
  if (status == ST_OK) return OK_MESSAGE;
  if ((status & (ST_DEVICE | ST_DRIVER | ST_WEIGHTS)) && detail[0]) return detail;
  for (size_t k = 0; k < sizeof MESSAGES / sizeof *MESSAGES; k++)
    if (status & MESSAGES[k].bit) return MESSAGES[k].text;
  return "unknown status";
}
"""


def c_source(spec: Any, plan: _Plan, blobs: Path) -> str:
    """The library's C source; the weights and code blobs are ``blobs``/weights.bin and
    code.bin."""
    n = spec.name
    statuses = "\n".join(f"#define ST_{s.name} {int(s)}" for s in Status)
    statuses = f"#define ST_OK {STATUS_OK}\n{statuses}"
    functions = [*((*f, 1) for f in DRIVER_FUNCTIONS),
                 *((*f, 0) for f in (*GRAPH_FUNCTIONS, GRAPH_UPDATE, TMA_ENCODE))]
    driver = "\n".join(f"  CUresult (*{field}){sig};" for field, _, sig, _ in functions)
    symbols = ",\n  ".join(f'{{"{sym}", offsetof(struct driver, {field}), {required}}}'
                           for field, sym, _, required in functions)
    graphs = " && ".join(f"cu.{field}" for field, _, _ in GRAPH_FUNCTIONS)
    messages = ",\n  ".join(f"{{{int(bit)}, {c_string(text)}}}"
                            for bit, text in STATUS_MESSAGES.items() if bit != STATUS_OK)

    def place(region: str, at: int, map_at: int = 0) -> str:
        return f"{{{REGIONS[region]}, {at}u, {map_at}u}}"

    args: list[str] = []
    launches = []
    for la in plan.launches:
        launches.append(f"{{{la.function}, {{{', '.join(map(str, la.grid))}}}, "
                        f"{{{', '.join(map(str, la.block))}}}, {len(args)}, {len(la.args)}}}")
        args += [place(*arg) for arg in la.args]
    copies = [f"{{{place(c.src.region, c.src.at)}, {c.output}, {c.nbytes}u}}"
              for c in spec.copies]
    for c in spec.copies:
        if c.src.region not in REGIONS:
            raise CompileError(f"output {c.output} is copied from {c.src.region}, which a "
                               "library cannot hold")
    infos = []
    tables = []
    for which, tensors in (("input", spec.inputs), ("output", spec.outputs)):
        rows = []
        for j, t in enumerate(tensors):
            tables.append(_array("int64_t", f"{which}{j}_shape", [str(d) for d in t.shape],
                                 "1"))
            rows.append(f"{{{c_string(t.name)}, {c_string(t.dtype)}, {len(t.shape)}, "
                        f"{which}{j}_shape}}")
        infos.append(_array(f"{n}_tensor_info", f"{which.upper()}S", rows))
    spans = ",\n  ".join("{" + ", ".join(f"{{{at}u, {size}u}}" for at, size in row) + "}"
                         for row in plan.spans)
    arch_names = ", ".join(f"{'compute' if ptx else 'sm'}_{cc}" for cc, ptx in plan.archs)
    max_args = max([len(la.args) for la in plan.launches], default=1)
    maps = [f"{{{DATA_TYPES[tm.dtype]}, {len(tm.shape)}, "
            f"{{{', '.join(f'{d}u' for d in reversed(tm.shape))}}}, "
            f"{{{', '.join(f'{d}u' for d in tm.strides()) or '0'}}}, "
            f"{{{', '.join(f'{d}u' for d in reversed(tm.box))}}}}}" for tm in plan.tensor_maps]
    weights = len(spec.weights)
    return f"""\
/* Generated by autosched: the CUDA model {n} ({plan.target}), over the CUDA driver API. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct {{ int result; void *node, *from_node; }} update_info; /* cuGraphExecUpdate's */

#include "{n}.h"

#define API __attribute__((visibility("default")))
{statuses}
#define CU_OUT_OF_MEMORY 2
#define CC_MAJOR 75
#define CC_MINOR 76
#define STREAM_NON_BLOCKING 1
#define CAPTURE_THREAD_LOCAL 1 /* other threads' driver calls do not break a recording */
#ifndef CUDA_GRAPHS
#define CUDA_GRAPHS 1 /* 0: launch each kernel on every run */
#endif
enum {{ IN, OUT, WEIGHTS, WORK }};

/* -- the model ------------------------------------------------------------------------- */

#define N_INPUTS {len(spec.inputs)}
#define N_OUTPUTS {len(spec.outputs)}
#define N_MODULES {len(plan.modules)}
#define N_FUNCTIONS {len(plan.functions)}
#define FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES 8  /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
#define N_LAUNCHES {len(plan.launches)}
#define N_COPIES {len(spec.copies)}
#define N_ARCHS {len(plan.archs)}
#define MAX_ARGS {max_args}
#define TMA_OPTIONS {", ".join(map(str, ENCODE_OPTIONS))} /* interleave, swizzle, L2, fill */
#define CHECKS {int(plan.checks)}
#define WEIGHTS_BYTES {weights}u
#define WORK_AT {_aligned(weights)}u
#define MEMORY_BYTES {_aligned(weights) + plan.workspace}u
#define STATUS_AT {plan.status_at}u
#define ARCH_NAMES {c_string(arch_names)}
#define DETAIL_BYTES {WEIGHTS_DETAIL_BYTES}

typedef struct {{ uint32_t region; uint64_t at; uint32_t map; }} place; /* map: 1 + TENSOR_MAPS' */
/* a TMA descriptor's tensor (innermost dimension first; byte strides of the others) and box */
typedef struct {{ int32_t dtype; uint32_t rank; uint64_t dims[5], strides[4]; uint32_t box[5]; }} tensor_map;
typedef struct {{ _Alignas(64) unsigned char bytes[128]; }} descriptor; /* CUtensorMap */
typedef struct {{ uint32_t function; uint32_t grid[3], block[3]; uint32_t first, count; }} launch;
typedef struct {{ place src; uint32_t output; uint64_t nbytes; }} copy;
typedef struct {{ int32_t cc, ptx; }} arch;
typedef struct {{ uint64_t at, size; }} span;

{_blob(f"{n}__weights", blobs / "weights.bin")}
{_blob(f"{n}__code", blobs / "code.bin")}


{_array("arch", "ARCHS", [f"{{{cc}, {int(ptx)}}}" for cc, ptx in plan.archs])}
static const span CODE[N_ARCHS][N_MODULES] = {{
  {spans}
}};
{_array("uint32_t", "FUNCTION_MODULE", [str(m) for m, _ in plan.functions], "0")}
{_array("char *const", "FUNCTION_NAME", [c_string(k) for _, k in plan.functions], "0")}
{_array("uint32_t", "FUNCTION_SHARED", [f"{b}u" for b in plan.function_shared], "0")}
{_array("launch", "LAUNCHES", launches, "{0, {0, 0, 0}, {0, 0, 0}, 0, 0}")}
{_array("place", "ARGS", args)}
{_array("tensor_map", "TENSOR_MAPS", maps, "{0, 0, {0}, {0}, {0}}")}
{_array("copy", "COPIES", copies, "{{0, 0, 0}, 0, 0}")}
{_array("uint64_t", "INPUT_BYTES", [f"{_tensor_bytes(t)}u" for t in spec.inputs], "0")}
{_array("uint64_t", "OUTPUT_BYTES", [f"{_tensor_bytes(t)}u" for t in spec.outputs], "0")}
{_array("uint64_t", "STAGE_IN", [f"{at}u" for at in plan.stage_in], "0")}
{_array("uint64_t", "STAGE_OUT", [f"{at}u" for at in plan.stage_out], "0")}
{chr(10).join(tables)}
{chr(10).join(infos)}

#define MODEL "{n}"
#define TARGET {c_string(str(plan.target))}
#define VERSION {c_string(spec.version)}
#define OK_MESSAGE {c_string(STATUS_MESSAGES[STATUS_OK])}
static const struct {{ int32_t bit; const char *text; }} MESSAGES[] = {{
  {messages}
}};

/* -- the CUDA driver, loaded at the first create: its functions -------------------------- */

struct driver {{
{driver}
}};
static struct driver cu;
static const struct {{ const char *name; size_t at; int required; }} SYMBOLS[] = {{
  {symbols}
}};
#define HAS_GRAPHS ({graphs})
{_weights_source(spec)}
{GLUE.replace('@name@', n)}"""


# A weights file (``spec.weights_file``), mapped and checked by create before the driver is
# loaded, uploaded by setup, unmapped: the CPU library's checks (llvm/weights_file.py) in C.
WEIGHTS_FILE = r"""
static void note(const char *format, ...);

static uint64_t checksum(const unsigned char *data, uint64_t words) {
  uint64_t total = 0;
  for (uint64_t i = 0; i < words; i++) {
    uint64_t x;
    memcpy(&x, data + 8 * i, 8);
    x ^= (i + 1) * HASH_STEP;
    x ^= x >> 31;
    x *= HASH_MIX;
    total += x ^ (x >> 29);
  }
  return total;
}

/* path, or when NULL MODEL.weights next to this library; maps it and checks it. */
static int32_t open_weights(const char *path, const unsigned char **mapping, size_t *length) {
  char found[PATH_BYTES];
  if (!path) {
    Dl_info info;
    int n = -1;
    if (dladdr((void *)(uintptr_t)open_weights, &info) && info.dli_fname) {
      const char *slash = strrchr(info.dli_fname, '/');
      n = snprintf(found, sizeof found, "%.*s%s",
                   slash ? (int)(slash - info.dli_fname + 1) : 0, info.dli_fname,
                   MODEL ".weights");
    }
    if (n < 0 || n >= (int)sizeof found) {
      note(FAIL_PATH, MODEL, PATH_BYTES);
      return ST_WEIGHTS;
    }
    path = found;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    note(FAIL_OPEN, MODEL, path, strerror(errno));
    return ST_WEIGHTS;
  }
  struct stat st;
  long long size = fstat(fd, &st) ? -1 : (long long)st.st_size;
  if (size < HEADER_BYTES) {
    note(FAIL_SIZE, MODEL, path, size);
    close(fd);
    return ST_WEIGHTS;
  }
  void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd);
  if (m == MAP_FAILED) {
    note(FAIL_MAP, MODEL, path, strerror(err));
    return ST_WEIGHTS;
  }
  const unsigned char *h = m;
  uint32_t version;
  memcpy(&version, h + 8, 4);
  int bad = 0; /* the first header field that differs from this library's says why */
  for (size_t k = 0; k < sizeof HEADER_CHECKS / sizeof *HEADER_CHECKS && !bad; k++)
    if ((bad = memcmp(h + HEADER_CHECKS[k].at, WEIGHTS_HEADER + HEADER_CHECKS[k].at,
                      HEADER_CHECKS[k].bytes) != 0))
      note(HEADER_CHECKS[k].format, MODEL, path, version); /* only one format reads version */
  if (!bad && (bad = size != FILE_BYTES))
    note(FAIL_TRUNCATED, MODEL, path, size, (long long)FILE_BYTES);
  if (!bad && (bad = checksum(h + HEADER_BYTES, WEIGHTS_BYTES_FILE / 8) != CHECKSUM))
    note(FAIL_CHECKSUM, MODEL, path);
  if (bad) {
    munmap(m, (size_t)size);
    return ST_WEIGHTS;
  }
  *mapping = h;
  *length = (size_t)size;
  return ST_OK;
}

static void close_weights(const unsigned char *mapping, size_t length) {
  munmap((void *)(uintptr_t)mapping, length);
}
"""


def _weights_source(spec: Any) -> str:
    """The C that gives create the weights: the embedded symbol, or the checked mapping of
    the weights file (WEIGHTS_FILE), with the header it must have."""
    n = spec.name
    if not spec.weights_file:
        return f"""\
#define WEIGHTS_AT 0
static int32_t open_weights(const char *path, const unsigned char **mapping, size_t *length) {{
  (void)path;
  *mapping = {n}__weights;
  *length = 0;
  return ST_OK;
}}
static void close_weights(const unsigned char *mapping, size_t length) {{
  (void)mapping;
  (void)length;
}}"""
    data = padded_weights(spec.weights)
    header = weights_header(n, data)
    checks = _array("struct { uint32_t at, bytes; const char *format; }", "HEADER_CHECKS",
                    [f"{{{start}, {end - start}, {c_string(WEIGHTS_FAILURES[why])}}}"
                     for why, start, end in WEIGHTS_CHECKS])
    defines = {
        "WEIGHTS_AT": WEIGHTS_HEADER_BYTES, "HEADER_BYTES": WEIGHTS_HEADER_BYTES,
        "PATH_BYTES": WEIGHTS_PATH_MAX, "FILE_BYTES": f"{len(header) + len(data)}ull",
        "WEIGHTS_BYTES_FILE": f"{len(data)}ull",
        "CHECKSUM": f"{int.from_bytes(header[24:32], 'little')}ull",
        "HASH_STEP": f"{HASH_STEP}ull", "HASH_MIX": f"{HASH_MIX}ull",
        **{f"FAIL_{why.upper()}": c_string(text) for why, text in WEIGHTS_FAILURES.items()}}
    lines = [f"#define {k} {v}" for k, v in defines.items()]
    table = _array("unsigned char", "WEIGHTS_HEADER", [", ".join(map(str, header))])
    return "\n".join([*lines, table, checks, WEIGHTS_FILE])
