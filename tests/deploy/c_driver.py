"""A C program that runs any model library: built with the host's cc or a cross compiler, run
(under qemu for a cross architecture) on raw input bytes; the ``c_runner`` fixture
(conftest.py) hands it to the tests. Built with ``-DDEVICE_POINTERS`` (a CUDA library), it
copies the inputs to the GPU itself (through libcuda.so.1, opened as the library opens it) and
runs the device-pointer entry ``NAME_run_device`` instead of ``NAME_run``."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

CROSS = {"aarch64": ("aarch64-linux-gnu-gcc", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])}

# Reads the inputs (raw bytes, in order) from argv[1], writes the outputs to argv[2], runs on
# argv[3] threads, maps the weights file argv[4] when given (else the library finds its own);
# the sizes come from the library's introspection, so one driver serves every model.
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "NAME.h"

static size_t nbytes(const NAME_tensor_info *t) {
  size_t n = strstr(t->dtype, "64") ? 8 : strstr(t->dtype, "32") ? 4
           : strstr(t->dtype, "16") ? 2 : 1;
  for (int32_t d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
  return n;
}

static void *buffer(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

#ifdef DEVICE_POINTERS
#include <dlfcn.h>
typedef unsigned long long dptr;
static int (*cu_init)(unsigned), (*cu_retain)(void **, int), (*cu_set)(void *);
static int (*cu_alloc)(dptr *, size_t), (*cu_htod)(dptr, const void *, size_t);
static int (*cu_dtoh)(void *, dptr, size_t), (*cu_sync)(void);

static int load_cuda(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  void *ctx;
  if (!lib) return 1;
  *(void **)&cu_init = dlsym(lib, "cuInit");
  *(void **)&cu_retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&cu_set = dlsym(lib, "cuCtxSetCurrent");
  *(void **)&cu_alloc = dlsym(lib, "cuMemAlloc_v2");
  *(void **)&cu_htod = dlsym(lib, "cuMemcpyHtoD_v2");
  *(void **)&cu_dtoh = dlsym(lib, "cuMemcpyDtoH_v2");
  *(void **)&cu_sync = dlsym(lib, "cuCtxSynchronize");
  return cu_init(0) || cu_retain(&ctx, 0) || cu_set(ctx);
}

/* NAME_run_device on copies of the host buffers on the GPU; the outputs copied back. */
static int32_t run(NAME_context *ctx, void **inputs, void **outputs) {
  dptr dev_in[16], dev_out[16];
  if (load_cuda()) return -1;
  for (int32_t i = 0; i < NAME_num_inputs(); i++) {
    size_t n = nbytes(NAME_input(i));
    if (cu_alloc(&dev_in[i], n) || cu_htod(dev_in[i], inputs[i], n)) return -1;
  }
  for (int32_t i = 0; i < NAME_num_outputs(); i++)
    if (cu_alloc(&dev_out[i], nbytes(NAME_output(i)))) return -1;
  int32_t status = NAME_run_device(ctx, (const void *const *)dev_in, (void *const *)dev_out);
  if (status || cu_sync()) return status ? status : -1;
  for (int32_t i = 0; i < NAME_num_outputs(); i++)
    if (cu_dtoh(outputs[i], dev_out[i], nbytes(NAME_output(i)))) return -1;
  return 0;
}
#else
static int32_t run(NAME_context *ctx, void **inputs, void **outputs) {
  return NAME_run(ctx, (const void *const *)inputs, outputs);
}
#endif

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) return 9;
  NAME_options options = {.num_threads = atoi(argv[3]), .weights_path = argv[4]};
  NAME_context *ctx;
  int32_t status = NAME_create(&options, &ctx);
  if (status) { fprintf(stderr, "create: %s\n", NAME_status_message(status)); return 2; }
  void *inputs[16], *outputs[16];
  FILE *in = fopen(argv[1], "rb");
  for (int32_t i = 0; i < NAME_num_inputs(); i++) {
    size_t n = nbytes(NAME_input(i));
    inputs[i] = buffer(n);
    if (fread(inputs[i], 1, n, in) != n) return 8;
  }
  fclose(in);
  for (int32_t i = 0; i < NAME_num_outputs(); i++) outputs[i] = buffer(nbytes(NAME_output(i)));
  status = run(ctx, inputs, outputs);
  if (status) { fprintf(stderr, "run: %s\n", NAME_status_message(status)); return 3; }
  FILE *out = fopen(argv[2], "wb");
  for (int32_t i = 0; i < NAME_num_outputs(); i++)
    fwrite(outputs[i], 1, nbytes(NAME_output(i)), out);
  fclose(out);
  NAME_destroy(ctx);
  printf("%s | %s\n", NAME_target(), NAME_version());
  return 0;
}
"""

class DriverError(RuntimeError):
    """The C driver exited with a failure."""


Runner = Callable[[Path, str, Sequence[np.ndarray], Sequence[tuple[tuple[int, ...], str]]],
                  list[np.ndarray]]


def tools(arch: str | None, cpu: str | None) -> tuple[str, list[str]]:
    if arch is None:
        return shutil.which("cc") or "gcc", []
    compiler, runner = CROSS[arch]
    for tool in (compiler, runner[0]):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install -y qemu-user "
                        "gcc-aarch64-linux-gnu libc6-dev-arm64-cross)")
    return compiler, runner + (["-cpu", cpu] if cpu else [])
