"""A C program that runs any model library: built with the host's cc or a cross compiler, run
(under qemu for a cross architecture) on raw input bytes; the ``c_runner`` fixture
(conftest.py) hands it to the tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

CROSS = {"aarch64": ("aarch64-linux-gnu-gcc", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])}

# Reads the inputs (raw bytes, in order) from argv[1], writes the outputs to argv[2]; the
# sizes come from the library's introspection, so one driver serves every model.
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

int main(int argc, char **argv) {
  if (argc != 4) return 9;
  NAME_options options = {.num_threads = atoi(argv[3])};
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
  status = NAME_run(ctx, (const void *const *)inputs, outputs);
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
