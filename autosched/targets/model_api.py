"""The C API of a model library (llvm/library.py builds one for CPUs, cuda/library.py for NVIDIA
GPUs): functions, status codes, header.

For a model named ``net``::

    typedef struct net_context net_context;
    typedef struct {
      int32_t num_threads;  /* CPU: 0 = OMP_NUM_THREADS / all cores; GPU libraries ignore it */
      int32_t device;       /* GPU: the CUDA device ordinal; CPU libraries ignore it */
      void *stream;         /* GPU: the CUstream, NULL = the default stream; CPU ignores it */
      const char *weights_path;  /* a library built with a weights file: its path, NULL =
                                    net.weights next to the library; others ignore it */
    } net_options;
    int32_t net_create(const net_options *options, net_context **context);
    int32_t net_run(net_context *context, const void *const *inputs, void *const *outputs);
    int32_t net_run_device(net_context *context, const void *const *inputs,
                           void *const *outputs);                       /* GPU libraries */
    void net_destroy(net_context *context);

``create`` checks the CPU and allocates the context's workspace; ``run`` reads the inputs and
writes the outputs (host pointers, in the order the introspection functions list them, each
16-byte aligned, row-major and contiguous); one context per thread makes concurrent runs safe.
A context's thread count is handed to each kernel as it starts (a kernel keeps it in one
process-wide variable): contexts that run at once should ask for the same count. The options
struct grew from the thread count alone, and fields are only ever appended: a CPU library reads
its first field (and ``weights_path`` when built with a weights file), a GPU library
``device``, ``stream`` (and ``weights_path`` likewise), so callers built against an older
layout work with the libraries that layout was written for.

A library built with a weights file (``export(model, out, weights_file=True)``, ``autosched
compile --weights-file``) holds no weights: ``NAME.weights`` (the format below) does, and
``create`` maps it read-only (a CPU library's kernels read it in place, each context its own
mapping of the same pages; a GPU library uploads it and unmaps it), after checking its
header against the one the library was built with and its contents against the checksum. A
missing, truncated, foreign or corrupted file gives the WEIGHTS status, whose message names
the file and what is wrong with it.

A GPU library's ``create`` loads the CUDA driver, picks the code for the GPU's arch, uploads the
weights and allocates the workspace on the device (each context its own); its ``run`` takes host
pointers (copies in, runs, copies out, waits for the stream) and ``run_device`` device pointers
(queued on the stream, not waited for, unless the kernels check indices: the header's
``NET_RUN_DEVICE_WAITS``). Every function returns a status: 0, or the bits below
(``net_status_message`` says which; for DEVICE and DRIVER, the last such failure's call and
reason, such as the GPU's arch).

This module needs no LLVM: the Python loader (graph/loader.py) takes the names from here.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import numpy as np

from autosched.targets.status import STATUS_ALLOC, STATUS_INDEX
from autosched.targets.status import STATUS_MESSAGES as KERNEL_MESSAGES

API = ("create", "run", "destroy", "num_inputs", "num_outputs", "input", "output", "target",
       "version", "status_message")
DEVICE_API = ("run_device",)  # GPU libraries only: a run on device pointers
STATUS_OK = 0


class Status(IntEnum):
    """What a library call reports: the kernels' bits (targets/status.py) and the library's."""

    ALLOC = STATUS_ALLOC
    INDEX = STATUS_INDEX
    ARGUMENT = 4
    CPU = 8
    DEVICE = 16
    DRIVER = 32
    WEIGHTS = 64


STATUS_MESSAGES = {
    STATUS_OK: "ok",
    Status.ALLOC: KERNEL_MESSAGES[STATUS_ALLOC],
    Status.INDEX: KERNEL_MESSAGES[STATUS_INDEX],
    Status.ARGUMENT: "a NULL context, or an input or output pointer that is NULL or not "
                     "16-byte aligned",
    Status.CPU: "this CPU lacks an instruction set extension the library was compiled for",
    Status.DEVICE: "no CUDA driver, no such GPU, or no code in the library for the GPU's arch",
    Status.DRIVER: "a CUDA driver call failed",
    Status.WEIGHTS: "the weights file is missing, truncated, corrupted or another model's",
}

# -- the weights file -----------------------------------------------------------------------
# A 128-byte header, then the weights (each at a 64-byte aligned offset, padded to a multiple
# of 64 bytes), all little-endian:
#   0  magic "AUSWGHTS"    8  u32 format version    12  u32 header bytes (where the weights start)
#   16 u64 weights bytes   24 u64 checksum          32  the model's name, NUL-padded to 64 bytes
#   96 zeros
# The checksum: over the weights as u64 words w_i, the sum (mod 2**64) of mix(w_i ^ (i + 1) *
# HASH_STEP), mix(x) = ((x ^ x >> 31) * HASH_MIX) ^ (that >> 29): a bijection of each word and
# its position, so any one changed word changes it, and numpy or a vectorising C compiler
# computes it at memory speed.

WEIGHTS_MAGIC = b"AUSWGHTS"
WEIGHTS_VERSION = 1
WEIGHTS_HEADER_BYTES = 128
WEIGHTS_ALIGN = 64
WEIGHTS_NAME_AT = 32
WEIGHTS_NAME_BYTES = 64
HASH_STEP = 0x9E3779B97F4A7C15
HASH_MIX = 0xBF58476D1CE4E5B9
_HEADER = struct.Struct("<8sIIQQ64s32x")

# Why create refused a weights file: printf formats shared by the CPU and GPU libraries, each
# given the model's name, then (all but "path") the file's path, then the values it names.
WEIGHTS_FAILURES = {
    "path": "%s: the weights file's path is unknown: the library's own path is not known, or "
            "longer than %d bytes (give options.weights_path)",
    "open": "%s: weights file %s: cannot open it (%s)",
    "size": "%s: weights file %s has %lld bytes, fewer than a weights file's header",
    "map": "%s: weights file %s: cannot map it (%s)",
    "magic": "%s: weights file %s is not an autosched weights file",
    "version": "%s: weights file %s has format version %u; this library reads version "
               f"{WEIGHTS_VERSION}",
    "model": "%s: weights file %s holds another model's weights",
    "build": "%s: weights file %s holds the weights of another build of this model (export "
             "the library and its weights together)",
    "truncated": "%s: weights file %s has %lld bytes, the weights need %lld: truncated",
    "checksum": "%s: weights file %s is corrupted: its contents do not match its checksum",
}
# (failure, start, end) of the header fields a library compares with its own header, in this
# order: a file that is no weights file, then one of another format, model or build, says so
WEIGHTS_CHECKS = (("magic", 0, 8), ("version", 8, 12),
                  ("model", WEIGHTS_NAME_AT, WEIGHTS_NAME_AT + WEIGHTS_NAME_BYTES),
                  ("build", 12, WEIGHTS_NAME_AT))
WEIGHTS_PATH_MAX = 4096
WEIGHTS_DETAIL_BYTES = 512


def padded_weights(data: bytes) -> bytes:
    """``data`` padded with zeros to a multiple of 64 bytes, as the weights file holds it."""
    return data + bytes(-len(data) % WEIGHTS_ALIGN)


def weights_checksum(data: bytes) -> int:
    """The checksum of ``data`` (a multiple of 8 bytes) that the weights file's header holds."""
    words = np.frombuffer(data, "<u8")
    total = 0
    step = 1 << 20
    for at in range(0, len(words), step):  # in chunks: a few MB of temporaries, not the model's
        i = np.arange(at + 1, at + 1 + len(words[at: at + step]), dtype=np.uint64)
        x = words[at: at + step] ^ (i * np.uint64(HASH_STEP))
        x ^= x >> np.uint64(31)
        x *= np.uint64(HASH_MIX)
        x ^= x >> np.uint64(29)
        total += int(x.sum(dtype=np.uint64))  # the array's sum wraps, as the C one does
    return total % (1 << 64)


def weights_header(name: str, data: bytes) -> bytes:
    """The header of the weights file of model ``name`` holding ``data`` (padded_weights);
    a library built with a weights file holds it too and compares it with the file's."""
    return _HEADER.pack(WEIGHTS_MAGIC, WEIGHTS_VERSION, WEIGHTS_HEADER_BYTES, len(data),
                        weights_checksum(data), name.encode())


def weights_file(name: str, data: bytes) -> bytes:
    """The whole weights file of model ``name``: its header, then ``data`` padded."""
    data = padded_weights(data)
    return weights_header(name, data) + data


def header(name: str, inputs: list[tuple[str, str, tuple[int, ...]]],
           outputs: list[tuple[str, str, tuple[int, ...]]], target: str, gpu: bool = False,
           run_device_waits: bool = False) -> str:
    """``name``.h: the API's declarations, with the inputs and outputs in comments. ``gpu`` (a
    CUDA library) adds ``run_device`` (which waits for the stream only when
    ``run_device_waits``: the kernels check indices) and says what create and run do there."""
    guard = f"{name.upper()}_H"
    lines = [f"/* {name}: a model compiled by autosched for {target}. */",
             f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", "",
             '#ifdef __cplusplus', 'extern "C" {', "#endif", "",
             "/* inputs and outputs, in the order of the pointer arrays of run(): */"]
    for which, tensors in (("input", inputs), ("output", outputs)):
        for j, (tname, dtype, shape) in enumerate(tensors):
            lines.append(f"/*   {which} {j}: {tname}, {dtype}{list(shape)} */")
    codes = "\n".join(f"#define {name.upper()}_STATUS_{s.name} {int(s)}" for s in Status)
    lines += ["", f"#define {name.upper()}_STATUS_OK 0", codes, "", f"""\
typedef struct {name}_context {name}_context;
typedef struct {{
  int32_t num_threads;  /* CPU: 0 = OMP_NUM_THREADS or all cores; GPU libraries ignore it */
  int32_t device;       /* GPU: the CUDA device ordinal; CPU libraries ignore it */
  void *stream;         /* GPU: the CUstream runs are queued on, NULL = the default stream;
                           CPU libraries ignore it */
  const char *weights_path;  /* a library built with a weights file: the file, NULL =
                                {name}.weights next to the library; other libraries ignore it */
}} {name}_options;
typedef struct {{
  const char *name;
  const char *dtype;     /* "float32", "int64", ... */
  int32_t ndim;
  const int64_t *shape;
}} {name}_tensor_info;

{_calls(name, gpu, run_device_waits)}
void {name}_destroy({name}_context *context);

int32_t {name}_num_inputs(void);
int32_t {name}_num_outputs(void);
const {name}_tensor_info *{name}_input(int32_t index);   /* NULL when out of range */
const {name}_tensor_info *{name}_output(int32_t index);
const char *{name}_target(void);
const char *{name}_version(void);    /* of autosched */
const char *{name}_status_message(int32_t status);

#ifdef __cplusplus
}}
#endif
#endif"""]
    return "\n".join(lines) + "\n"


def _calls(name: str, gpu: bool, waits: bool) -> str:
    """The declarations of create and run, with what they do on the CPU or the GPU."""
    run = (f"int32_t {name}_run({name}_context *context, const void *const *inputs, "
           "void *const *outputs);")
    if not gpu:
        return f"""\
/* Checks the CPU, maps and checks the weights file (a library built with one), allocates
   a context (its workspace); options may be NULL. */
int32_t {name}_create(const {name}_options *options, {name}_context **context);
/* One inference: inputs and outputs are arrays of host pointers (16-byte aligned). */
{run}"""
    return f"""\
#define {name.upper()}_RUN_DEVICE_WAITS {int(waits)}  /* 1: run_device waits to read kernel checks */

/* Loads the CUDA driver (libcuda.so.1), picks the code built for the GPU's arch, uploads the
   weights (a library built with a weights file maps and checks it first) and allocates the
   workspace on options->device; options may be NULL (device 0, the default stream). Each
   context has its own device memory. */
int32_t {name}_create(const {name}_options *options, {name}_context **context);
/* One inference on HOST pointers: copies the inputs to the GPU, runs, copies the outputs
   back and waits for the stream; a kernel's failure is returned as the status. */
{run}
/* One inference on DEVICE pointers (16-byte aligned, on the context's device): queued on the
   stream; does not wait for it (unless {name.upper()}_RUN_DEVICE_WAITS is 1: then it waits
   to read the kernels' checks). Synchronise the stream before reading the outputs. */
int32_t {name}_run_device({name}_context *context, const void *const *inputs,
    void *const *outputs);"""


def readme(name: str, target: str, gpu: bool = False, weights_file: bool = False) -> str:
    """The build dir's README: what is there and a C program that runs the model (``gpu``: a
    CUDA library, whose run takes host pointers too; ``weights_file``: its weights are in
    NAME.weights)."""
    weights = "" if weights_file else "weights, "
    what = (f"cubins, {weights}memory plan (links libc, libdl; loads libcuda.so.1)" if gpu else
            f"kernels, {weights}memory plan, thread pool (links libc, libm)")
    options = ".device = 0, .stream = NULL" if gpu else ".num_threads = 0"
    share = ("each has its own weights and workspace on the GPU.\nNAME_run_device takes "
             "device pointers and does not wait for the stream" if gpu else
             "contexts share the weights, each has its own workspace").replace("NAME", name)
    return f"""\
{name}: a model compiled by autosched for {target}

  {name}.so   the model: {what}
  {name}.h    its C API
{_weights_line(name) if weights_file else ""}
Build and run (allocate each input and output as the introspection functions say):

    #include <stdio.h>
    #include <stdlib.h>
    #include "{name}.h"

    static void *tensor(const {name}_tensor_info *t) {{
      size_t n = 1;
      for (int32_t d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
      return aligned_alloc(64, (n * 8 + 63) / 64 * 64);   /* 8: the widest dtype */
    }}

    int main(void) {{
      {name}_context *ctx;
      {name}_options options = {{{options}}};
      int32_t status = {name}_create(&options, &ctx);
      if (status) {{ fprintf(stderr, "%s\\n", {name}_status_message(status)); return 1; }}
      void *inputs[64], *outputs[64];
      for (int32_t i = 0; i < {name}_num_inputs(); i++) inputs[i] = tensor({name}_input(i));
      for (int32_t i = 0; i < {name}_num_outputs(); i++) outputs[i] = tensor({name}_output(i));
      /* ... fill the inputs ... */
      status = {name}_run(ctx, (const void *const *)inputs, outputs);
      if (status) fprintf(stderr, "%s\\n", {name}_status_message(status));
      {name}_destroy(ctx);
      return status != 0;
    }}

    cc main.c -o main ./{name}.so -Wl,-rpath,'$ORIGIN'

One context per thread: {share}.
In Python: autosched.load("THIS_DIR").run({{"input name": array}}).
"""


def _weights_line(name: str) -> str:
    return (f"  {name}.weights  its weights, which create maps and checks: keep it next to "
            f"{name}.so,\n               or give its path in options.weights_path\n")
