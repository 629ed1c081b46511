"""The C++20 text that lets g++ compile the CUDA C of codegen.py for the host (host_emulate.py).

CUDA keywords become nothing (``__global__``), host spellings (``__align__`` -> ``alignas``) or
small shims (``rsqrtf``, ``__expf``, ``half`` as ``_Float16``). The threads of a block are fibers
run by one OS thread: each runs until it reaches ``__syncthreads()`` or ends, then the next one
runs; the barrier opens when every thread waits at it. Blocks run one after another, so a
function-static array is the block's shared memory. Deterministic, and a few nanoseconds per
switch, where an OS thread per CUDA thread needs a kernel round trip per barrier and thread.

In the checked build (``CHECKED``) buffers are wrapped: every global, shared and local access is
bounds-checked, vector accesses are checked for alignment, and a shadow word per element of each
written global and each shared buffer records who last wrote and read it in which barrier
interval, so that races between the threads of a block (no barrier between a write and another
thread's access) and between blocks (one block writes what another reads or writes) are errors.
Shared and local memory start as NaN (integers: all bits set), as garbage would on the GPU.

The first error is kept (code and message, with kernel, block, thread, buffer and element); the
launch stops at the next barrier and the launcher returns the code.

``nvcuda::wmma`` (codegen's tensorized nests, targets/cuda/wmma.py) is emulated with fragments
that hold the whole tile in every lane: each lane loads all of it and multiplies it out in
float32 (exact products of the half inputs, summed in k order), and only lane 0 of a warp
stores it, so the race checks see one writer, as the GPU's lanes write disjoint parts.
"""

from __future__ import annotations

# error codes of a launch, shared with host_emulate.py
ERROR_NAMES = {
    1: "out-of-bounds access",
    2: "data race",
    3: "divergent __syncthreads",
    4: "misaligned vector access",
    5: "time limit exceeded",
    6: "bad launch",
    7: "mbarrier misuse",
}

PRELUDE = r"""
// autosched: CUDA C on the host (see autosched/targets/cuda/host_prelude.py)
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <bit>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __syncthreads() as_emu::syncthreads(__LINE__)
#define AS_API extern "C" __attribute__((visibility("default")))
#define AS_HOST_EMULATION 1  // codegen's PRELUDE_ASYNC gives way to the copies below

struct uint3 { unsigned x, y, z; };
// read by the kernels; set by the fiber scheduler before it resumes a thread
uint3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
// cp.async as a plain copy (src_bytes read, the rest zero-filled); groups complete at once
template <class P> inline void as_cp_async(P* d, const P* s, int src_bytes) {
  if (src_bytes == (int)sizeof(P)) {
    *d = *s;
  } else {
    memcpy((void*)d, (const void*)s, src_bytes);
    memset((char*)d + src_bytes, 0, sizeof(P) - src_bytes);
  }
}
inline void as_cp_async_commit() {}
template <int N> inline void as_cp_async_wait() {}

typedef _Float16 half;
inline half __float2half(float x) { return (half)x; }
inline float __half2float(half x) { return (float)x; }
// bfloat16 as cuda_bf16.h rounds it: the upper half of a float's bits, to nearest even
struct __nv_bfloat16 { unsigned short bits; };
inline __nv_bfloat16 __float2bfloat16(float x) {
  unsigned u; __builtin_memcpy(&u, &x, 4);
  if (x != x) return {0x7fc0};
  return {(unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 x) {
  unsigned u = (unsigned)x.bits << 16; float f; __builtin_memcpy(&f, &u, 4); return f;
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
// each rounded on its own, as on the GPU (g++ runs with -ffp-contract=off: nothing fuses
// unless the source says fmaf)
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline double __dadd_rn(double x, double y) { return x + y; }
inline double __dsub_rn(double x, double y) { return x - y; }
inline double __dmul_rn(double x, double y) { return x * y; }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
// the threads of a block run one at a time (fibers on one OS thread): a plain read-modify-write
inline int atomicOr(int* p, int v) { int old = *p; *p = old | v; return old; }

extern "C" void as_switch(void** save_sp, void* load_sp);
// Save the callee-saved registers and the float control words on this stack, store the stack
// pointer in *save_sp, continue on load_sp (the System V x86-64 convention).
asm(R"(
  .text
  .p2align 4
  .globl as_switch
  .hidden as_switch
  .type as_switch,@function
as_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size as_switch, .-as_switch
)");

namespace as_emu {

// WAITING: for an mbarrier's phase; AT_NAMED: at a barrier of some of the threads (bar.sync)
enum { RUNNING, AT_BARRIER, DONE, WAITING, AT_NAMED };
struct Fiber { void* sp; int state; int line; int bar, bar_threads; };

constexpr size_t STACK = 1 << 20;  // bytes per thread; pages are committed only when touched
constexpr size_t PAGE = 4096;

Fiber* fibers;
int nthreads;
int cur;  // the running thread (linear id)
void* sched_sp;
void (*body)(void*);
void* body_ctx;
const char* kernel;
uint32_t block_serial;  // 1, 2, ... for every block run (in every launch)
uint32_t phase;         // one per barrier interval of every block: unique in the process
int err_code;
char err_msg[2048];
long long n_uninit, n_dup;
char uninit_msg[512], dup_msg[512];

void where(char* out, size_t n, int t) {
  int x = t % (int)blockDim.x, y = (t / (int)blockDim.x) % (int)blockDim.y;
  int z = t / ((int)blockDim.x * (int)blockDim.y);
  snprintf(out, n, "kernel %s block (%u, %u, %u) thread (%d, %d, %d)", kernel, blockIdx.x,
           blockIdx.y, blockIdx.z, x, y, z);
}

__attribute__((format(printf, 2, 3), noinline)) void fail(int code, const char* fmt, ...) {
  if (err_code) return;  // the first error is the one to fix
  err_code = code;
  char at[256];
  where(at, sizeof at, cur);
  int k = snprintf(err_msg, sizeof err_msg, "%s: ", at);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg + k, sizeof err_msg - k, fmt, ap);
  va_end(ap);
}

__attribute__((noinline)) void warn(long long* count, char* msg, const char* what,
                                    const char* buf, long long i) {
  if ((*count)++) return;
  char at[256];
  where(at, sizeof at, cur);
  snprintf(msg, 512, "%s: %s %s[%lld]", at, what, buf, i);
}

void syncthreads(int line) {
  fibers[cur].state = AT_BARRIER;
  fibers[cur].line = line;
  as_switch(&fibers[cur].sp, sched_sp);
}

unsigned long long mbar_events;  // arrivals and copies completed on mbarriers, ever

// a thread whose mbarrier phase has not completed lets the others run (the scheduler resumes
// it after a round in which some mbarrier moved; none moving is a hang)
void wait_turn() {
  fibers[cur].state = WAITING;
  as_switch(&fibers[cur].sp, sched_sp);
}

// bar.sync id, threads: waits until that many threads have arrived at barrier id
void named_barrier(int id, int threads) {
  fibers[cur].state = AT_NAMED;
  fibers[cur].bar = id;
  fibers[cur].bar_threads = threads;
  as_switch(&fibers[cur].sp, sched_sp);
}

// releases the named barriers every thread of has arrived at; whether one was
bool release_named(Fiber* fs) {
  bool released = false;
  for (int id = 1; id < 16 && !err_code; ++id) {
    int at = 0, want = 0;
    for (int i = 0; i < nthreads; ++i)
      if (fs[i].state == AT_NAMED && fs[i].bar == id) {
        ++at;
        want = fs[i].bar_threads;
      }
    if (!at || at < want) continue;
    if (at > want || want % warpSize) {
      fail(3, "%d threads arrive at barrier %d, which counts %d", at, id, want);
      break;
    }
    for (int i = 0; i < nthreads; ++i)
      if (fs[i].state == AT_NAMED && fs[i].bar == id) fs[i].state = RUNNING;
    released = true;
  }
  return released;
}

void fiber_main() {
  body(body_ctx);
  fibers[cur].state = DONE;
  as_switch(&fibers[cur].sp, sched_sp);
  __builtin_trap();  // a finished thread is never resumed
}

void start_fiber(char* stacks, int i, uint64_t csr) {
  uint64_t* sp = (uint64_t*)(stacks + (i + 1) * STACK);
  *--sp = 0;                        // return address of fiber_main (never used)
  *--sp = (uint64_t)&fiber_main;    // where as_switch "returns" to
  for (int r = 0; r < 6; ++r) *--sp = 0;
  *--sp = csr;
  fibers[i].sp = sp;
  fibers[i].state = RUNNING;
}

double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// order: 0 threads in id order each round, 1 reversed, 2+ a fresh shuffle each round (seed)
int run(const char* name, long long bounds, const long long* launch, int order, double limit,
        void (*fn)(void*), void* ctx) {
  kernel = name;
  err_code = 0;
  err_msg[0] = uninit_msg[0] = dup_msg[0] = 0;
  n_uninit = n_dup = 0;
  gridDim = {(unsigned)launch[0], (unsigned)launch[1], (unsigned)launch[2]};
  blockDim = {(unsigned)launch[3], (unsigned)launch[4], (unsigned)launch[5]};
  long long total = launch[3] * launch[4] * launch[5];
  cur = 0;
  if (total < 1 || total > 1024 || (bounds > 0 && total > bounds)) {
    fail(6, "block (%lld, %lld, %lld) has %lld threads; the limit is %lld", launch[3],
         launch[4], launch[5], total, bounds > 0 ? bounds : 1024LL);
    return err_code;
  }
  nthreads = (int)total;
  char* stacks = (char*)mmap(nullptr, STACK * nthreads, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) {
    fail(6, "cannot map %d thread stacks", nthreads);
    return err_code;
  }
  for (int i = 0; i < nthreads; ++i) mprotect(stacks + i * STACK, PAGE, PROT_NONE);
  Fiber* fs = (Fiber*)calloc(nthreads, sizeof(Fiber));
  int* perm = (int*)malloc(sizeof(int) * nthreads);
  fibers = fs;
  body = fn;
  body_ctx = ctx;
  uint32_t mx;
  uint16_t cw;
  asm volatile("stmxcsr %0" : "=m"(mx));
  asm volatile("fnstcw %0" : "=m"(cw));
  uint64_t csr = mx | ((uint64_t)cw << 32);
  uint64_t rnd = 0x9E3779B97F4A7C15ULL * (uint64_t)(order + 1);
  double t0 = now();
  for (long long b = 0; b < launch[0] * launch[1] * launch[2] && !err_code; ++b) {
    blockIdx = {(unsigned)(b % launch[0]), (unsigned)(b / launch[0] % launch[1]),
                (unsigned)(b / (launch[0] * launch[1]))};
    ++block_serial;
    ++phase;
    for (int i = 0; i < nthreads; ++i) start_fiber(stacks, i, csr);
    unsigned long long events = mbar_events;
    for (;;) {
      for (int i = 0; i < nthreads; ++i) perm[i] = order == 1 ? nthreads - 1 - i : i;
      if (order >= 2) {
        for (int i = nthreads - 1; i > 0; --i) {
          rnd ^= rnd << 13; rnd ^= rnd >> 7; rnd ^= rnd << 17;
          int j = (int)(rnd % (uint64_t)(i + 1));
          int t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
      }
      for (int k = 0; k < nthreads && !err_code; ++k) {
        int i = perm[k];
        if (fs[i].state != RUNNING) continue;
        cur = i;
        threadIdx = {(unsigned)(i % launch[3]), (unsigned)(i / launch[3] % launch[4]),
                     (unsigned)(i / (launch[3] * launch[4]))};
        as_switch(&sched_sp, fs[i].sp);
      }
      if (err_code) break;
      // named barriers that all their threads reached open (a barrier interval of theirs ends:
      // the race records take it as one for every thread); threads waiting on an mbarrier run
      // again once some mbarrier moved; neither happening while some wait is a hang
      bool moved = release_named(fs), blocked = false, named = false;
      if (moved) ++phase;
      for (int i = 0; i < nthreads; ++i) {
        blocked |= fs[i].state == WAITING;
        named |= fs[i].state == AT_NAMED;
      }
      if (blocked && (moved || mbar_events != events)) {
        events = mbar_events;
        for (int i = 0; i < nthreads; ++i)
          if (fs[i].state == WAITING) fs[i].state = RUNNING;
        continue;
      }
      if (err_code) break;
      if (moved) continue;
      if (blocked) {
        for (cur = 0; fs[cur].state != WAITING; ++cur) {}
        fail(7, "waits for an mbarrier phase that no thread or copy completes (on the GPU: "
             "a hang)");
        break;
      }
      if (named) {
        for (cur = 0; fs[cur].state != AT_NAMED; ++cur) {}
        fail(3, "waits at barrier %d for %d threads, which never all arrive (on the GPU: a "
             "hang)", fs[cur].bar, fs[cur].bar_threads);
        break;
      }
      int done = -1, waiting = -1;
      for (int i = 0; i < nthreads; ++i) {
        if (fs[i].state == DONE && done < 0) done = i;
        if (fs[i].state == AT_BARRIER) {
          if (waiting >= 0 && fs[i].line != fs[waiting].line) {
            cur = i;
            fail(3, "waits at the __syncthreads of line %d while thread %d waits at the one of "
                 "line %d", fs[i].line, waiting, fs[waiting].line);
            break;
          }
          if (waiting < 0) waiting = i;
        }
      }
      if (err_code || waiting < 0) break;  // an error, or every thread is done
      if (done >= 0) {
        cur = waiting;
        fail(3, "waits at the __syncthreads of line %d, which thread %d (linear id) never "
             "reaches: it finished the kernel (on the GPU: a hang or undefined behaviour)",
             fs[waiting].line, done);
        break;
      }
      ++phase;
      for (int i = 0; i < nthreads; ++i) fs[i].state = RUNNING;
      if (now() - t0 > limit) {
        fail(5, "the launch ran longer than %.1f s on the host", limit);
        break;
      }
    }
  }
  munmap(stacks, STACK * nthreads);
  free(fs);
  free(perm);
  fibers = nullptr;
  return err_code;
}

template <class F> void call(void* f) { (*(F*)f)(); }

template <class F>
int launch(const char* name, long long bounds, const long long* sizes, int order, double limit,
           F& f) {
  return run(name, bounds, sizes, order, limit, &call<F>, &f);
}

// -- checked memory (used only by the checked build) -------------------------------------------

constexpr uint32_t MULTI = 0xffffffffu;
struct Shadow { uint32_t wb, wt, wp, rb, rt, rp; };  // writer / reader: block, thread + 1, phase
enum { GLOBAL, SHARED };
struct Mem { const char* name; void* data; long long n; Shadow* sh; int kind; };
alignas(64) char scratch[64];  // where an access out of bounds goes instead

const char* who(uint32_t t) {
  static char buf[64];
  if (t == MULTI) return "another thread";
  snprintf(buf, sizeof buf, "thread %u (linear id)", t - 1);
  return buf;
}

void on_read(const Mem* m, Shadow& s, long long i) {
  uint32_t b = block_serial, t = (uint32_t)cur + 1, p = phase;
  if (m->kind == SHARED && s.wb == 0) {
    warn(&n_uninit, uninit_msg, "reads shared memory no thread of the block wrote:", m->name, i);
  } else if (m->kind == GLOBAL && s.wb && s.wb != b) {
    fail(2, "reads %s[%lld], which another block wrote in this launch (blocks are unordered)",
         m->name, i);
  } else if (s.wp == p && s.wt != t) {
    fail(2, "reads %s[%lld], which %s wrote with no __syncthreads in between", m->name, i,
         who(s.wt));
  }
  s.rb = s.rb == 0 || s.rb == b ? b : MULTI;
  if (s.rp != p) {
    s.rp = p;
    s.rt = t;
  } else if (s.rt != t) {
    s.rt = MULTI;
  }
}

void on_write(const Mem* m, Shadow& s, long long i, const void* old, const void* val,
              size_t size) {
  uint32_t b = block_serial, t = (uint32_t)cur + 1, p = phase;
  if (m->kind == GLOBAL && s.wb && s.wb != b) {
    if (val && memcmp(old, val, size) == 0)
      warn(&n_dup, dup_msg, "writes the value another block wrote to", m->name, i);
    else
      fail(2, "writes %s[%lld], which another block also wrote (with a different value) in "
           "this launch", m->name, i);
  } else if (m->kind == GLOBAL && s.rb && s.rb != b) {
    fail(2, "writes %s[%lld], which another block read in this launch", m->name, i);
  } else if (s.wp == p && s.wt != t) {
    fail(2, "writes %s[%lld], which %s also wrote with no __syncthreads in between", m->name, i,
         who(s.wt));
  } else if (s.rp == p && s.rt != t) {
    fail(2, "writes %s[%lld], which %s read with no __syncthreads in between", m->name, i,
         who(s.rt));
  }
  s.wb = b;
  s.wt = t;
  s.wp = p;
}

// the address of elements [i, i + lanes) of m, or of scratch when that is out of bounds
__attribute__((noinline)) void* out_of_bounds(const Mem* m, long long i, int lanes, bool write) {
  if (lanes == 1)
    fail(1, "%s %s[%lld] out of bounds (%s has %lld elements)", write ? "writes" : "reads",
         m->name, i, m->name, m->n);
  else
    fail(1, "%s %s[%lld .. %lld] (a %d-lane vector) out of bounds (%s has %lld elements)",
         write ? "writes" : "reads", m->name, i, i + lanes - 1, lanes, m->name, m->n);
  return scratch;
}

template <class T>
inline T* access(const Mem* m, long long i, int lanes, bool write, const T* val) {
  if (i < 0 || i + lanes > m->n) return (T*)out_of_bounds(m, i, lanes, write);
  T* p = (T*)m->data + i;
  if (m->sh) {
    for (int l = 0; l < lanes; ++l) {
      if (write)
        on_write(m, m->sh[i + l], i + l, p + l, val ? val + l : nullptr, sizeof(T));
      else
        on_read(m, m->sh[i + l], i + l);
    }
  }
  return p;
}

template <class T> void garbage(T* p, long long n) {
  if constexpr (std::is_same_v<T, bool>) {
    for (long long i = 0; i < n; ++i) p[i] = true;
  } else {
    memset((void*)p, 0xff, sizeof(T) * n);  // NaN for floats, -1 / max for integers
  }
}

template <class T> struct Addr;

// an element of a checked buffer: reading converts it to T, assigning writes it
template <class T> struct Ref {
  const Mem* m;
  long long i;
  operator T() const { return *access<T>(m, i, 1, false, nullptr); }
  Ref& operator=(T v) {
    *access<T>(m, i, 1, true, &v) = v;
    return *this;
  }
  Ref& operator=(const Ref& o) { return *this = (T)o; }
  Addr<T> operator&() const { return {m, i}; }
};

// &buffer[i], cast by codegen to a float2 / float4 pointer for a vector access
template <class T> struct Addr {
  const Mem* m;
  long long i;
  template <class P> operator P*() const {
    constexpr int lanes = sizeof(P) / sizeof(T);
    constexpr bool write = !std::is_const_v<P>;
    T* p = (T*)m->data + i;
    if ((uintptr_t)p % alignof(P) && i >= 0 && i + lanes <= m->n)
      fail(4, "%s %s[%lld] as a %d-lane vector, which is not %zu-byte aligned (on the GPU: "
           "misaligned address)", write ? "writes" : "reads", m->name, i, lanes, alignof(P));
    return (P*)access<T>(m, i, lanes, write, nullptr);
  }
};

template <class T> struct Global {
  Mem m;
  Ref<T> operator[](long long i) const { return {&m, i}; }
};

template <class T, long long N> struct Shared {
  const char* name;
  uint32_t stamp;
  Mem m;
  alignas(32) T data[N];
  Shadow sh[N];
  // a block's shared memory starts as garbage, with no writer
  Ref<T> operator[](long long i) {
    if (stamp != block_serial) {
      stamp = block_serial;
      m = {name, data, N, sh, SHARED};
      garbage(data, N);
      memset(sh, 0, sizeof sh);
    }
    return {&m, i};
  }
};

template <class T, long long N> struct Local {
  const char* name;
  T data[N];
  explicit Local(const char* nm) : name(nm) { garbage(data, N); }
  T& operator[](long long i) {
    if (i < 0 || i >= N) {
      fail(1, "%s local %s[%lld] out of bounds (%lld elements)", "accesses", name, i, N);
      return *(T*)scratch;
    }
    return data[i];
  }
};

struct ShadowBuf {
  Shadow* p;
  explicit ShadowBuf(long long n) : p((Shadow*)calloc(n > 0 ? n : 1, sizeof(Shadow))) {}
  ~ShadowBuf() { free(p); }
};

}  // namespace as_emu

// -- nvcuda::wmma: every lane holds the whole tile -------------------------------------------

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision { struct tf32 {}; }
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct tile_shape { static constexpr int r = M, c = N; };
template <int M, int N, int K> struct tile_shape<matrix_a, M, N, K> {
  static constexpr int r = M, c = K;
};
template <int M, int N, int K> struct tile_shape<matrix_b, M, N, K> {
  static constexpr int r = K, c = N;
};
template <class T> struct storage { using type = T; };
template <> struct storage<precision::tf32> { using type = float; };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static constexpr int rows = tile_shape<Use, M, N, K>::r, cols = tile_shape<Use, M, N, K>::c;
  static constexpr int num_elements = rows * cols;
  typename storage<T>::type x[num_elements];  // row-major, whatever the layout in memory
};

inline float to_float(float v) { return v; }
inline float to_float(half v) { return (float)v; }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
// tf32 keeps 10 mantissa bits, rounded to nearest with ties away from zero (cvt.rna.tf32.f32)
inline float __float_to_tf32(float v) {
  unsigned u; __builtin_memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  float f; __builtin_memcpy(&f, &u, 4); return f;
}

template <class T> T element(const T* p, long long i) { return p[i]; }
template <class T> T element(as_emu::Addr<T> p, long long i) {
  return (T)as_emu::Ref<T>{p.m, p.i + i};
}
template <class T> void put(T* p, long long i, T v) { p[i] = v; }
template <class T> void put(as_emu::Addr<T> p, long long i, T v) {
  as_emu::Ref<T>{p.m, p.i + i} = v;
}

template <class Use, int M, int N, int K, class T, class L, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, P p, unsigned ld) {
  using F = fragment<Use, M, N, K, T, L>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = element(p, std::is_same_v<L, col_major> ? (long long)c * ld + r
                                                                     : (long long)r * ld + c);
}

template <int M, int N, int K, class V>
void fill_fragment(fragment<accumulator, M, N, K, float>& f, V v) {
  for (float& e : f.x) e = (float)v;
}

template <int M, int N, int K, class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d,
              const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c.x[i * N + j];
      for (int k = 0; k < K; ++k) s += to_float(a.x[i * K + k]) * to_float(b.x[k * N + j]);
      out[i * N + j] = s;
    }
  for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}

template <int M, int N, int K, class P>
void store_matrix_sync(P p, const fragment<accumulator, M, N, K, float>& f, unsigned ld,
                       layout_t layout) {
  if (as_emu::cur % warpSize) return;  // lane 0 of the warp writes the tile
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      put(p, layout == mem_col_major ? (long long)c * ld + r : (long long)r * ld + c,
          f.x[r * N + c]);
}
}  // namespace wmma
}  // namespace nvcuda

// -- wgmma main loops (targets/cuda/wgmma.py): copies as copies, each thread's accumulators as
// its own dot products, read through the descriptors and the 128-byte swizzle ----------------

namespace as_emu {
unsigned char* wg_window;  // the operand region of the running block (blocks run one at a time)

template <class T> float wg_element(unsigned long long desc, bool mn_major, int mn, int k) {
  unsigned addr = (unsigned)(desc & 0x3FFFu) << 4;
  unsigned lbo = (unsigned)((desc >> 16) & 0x3FFFu) << 4;
  unsigned sbo = (unsigned)((desc >> 32) & 0x3FFFu) << 4;
  unsigned byte;
  if (!mn_major) {
    byte = addr + (mn / 8) * sbo + (mn % 8) * 128 + k * sizeof(T);
  } else {
    int per = 128 / sizeof(T);
    byte = addr + (mn / per) * lbo + (k / 8) * sbo + (k % 8) * 128 + (mn % per) * sizeof(T);
  }
  byte ^= ((byte >> 7) & 7u) << 4;  // the swizzle: 16-byte chunk ^ row within 8
  T v;
  memcpy(&v, wg_window + byte, sizeof(T));
  float f = nvcuda::wmma::to_float(v);
  return sizeof(T) == 4 ? nvcuda::wmma::__float_to_tf32(f) : f;
}

template <int N, int KS, class T, bool TA, bool TB>
void wgmma(float (&d)[N / 2], unsigned long long da, unsigned long long db) {
  int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  for (int i = 0; i < N / 2; ++i) {
    int row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    float s = 0.f;
    for (int k = 0; k < KS; ++k) s += wg_element<T>(da, TA, row, k) * wg_element<T>(db, TB, col, k);
    d[i] += s;
  }
}
}  // namespace as_emu

inline unsigned as_wg_base(const void* p) {
  as_emu::wg_window = (unsigned char*)(((uintptr_t)p + 1023) & ~(uintptr_t)1023);
  return 0;
}
// a checked build's shared tile (its first access of the block resets it)
template <class T, long long N> unsigned as_wg_base(as_emu::Shared<T, N>& s) {
  s[0];
  return as_wg_base((const void*)s.data);
}
inline void as_wg_cp16(unsigned dst, const uint4* src, bool ok) {
  if (ok) memcpy(as_emu::wg_window + dst, (const void*)src, 16);
  else memset(as_emu::wg_window + dst, 0, 16);
}
// -- TMA copies and mbarriers (targets/cuda/tma.py): a copy lands at once and completes its
// bytes on its mbarrier; a thread waiting for a phase that has not completed lets others run

struct as_tensor_map {  // what the descriptor describes (the launcher fills it in)
  const unsigned char* base;
  long long bytes;  // the buffer's
  int rank, itemsize;
  long long dims[5], box[5];  // innermost first
};

namespace as_emu {
struct Mbar { long long expected, pending, tx; unsigned phase; };
Mbar mbars[64];
unsigned mbar_at[64];  // shared byte offsets of the live ones (0: free)
int n_mbars;

Mbar* mbar(unsigned bar, const char* what) {
  for (int i = 0; i < n_mbars; ++i)
    if (mbar_at[i] == bar + 1) return &mbars[i];
  fail(7, "%s the mbarrier at shared byte %u, which no thread initialized", what, bar);
  return nullptr;
}

void mbar_moved(Mbar& m) {
  ++mbar_events;
  if (m.pending < 0) fail(7, "an mbarrier phase got more arrivals than its count");
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    m.pending = m.expected;
  }
}

template <int R> void tma_load(unsigned dst, const as_tensor_map& tm, unsigned bar,
                               const int (&c)[R]) {
  Mbar* m = mbar(bar, "copies onto");
  if (!m) return;
  if (tm.rank != R || tm.box[0] * tm.itemsize != 128) {
    fail(7, "a rank-%d copy through a tensor map of rank %d (its box rows of %lld bytes)", R,
         tm.rank, tm.box[0] * tm.itemsize);
    return;
  }
  long long rows = 1, n = 0;
  for (int d = 1; d < R; ++d) rows *= tm.box[d];
  for (long long r = 0; r < rows; ++r) {
    long long at = 0, stride = tm.itemsize, rest = r;
    bool inside = true;
    for (int d = 0; d < R; ++d) {
      long long g = c[d];
      if (d > 0) {
        g += rest % tm.box[d];
        rest /= tm.box[d];
      }
      inside &= g >= 0 && g < tm.dims[d];
      if (d > 0) at += g * stride;
      stride *= tm.dims[d];
    }
    for (long long e = 0; e < tm.box[0]; ++e, ++n) {
      unsigned byte = (unsigned)(n * tm.itemsize);
      byte ^= ((byte >> 7) & 7u) << 4;  // the 128-byte swizzle
      long long g = c[0] + e, src = at + g * tm.itemsize;
      if (inside && g >= 0 && g < tm.dims[0]) {
        if (src < 0 || src + tm.itemsize > tm.bytes) {
          fail(1, "a TMA copy reads byte %lld of a %lld-byte buffer", src, tm.bytes);
          return;
        }
        memcpy(wg_window + dst + byte, tm.base + src, tm.itemsize);
      } else {
        memset(wg_window + dst + byte, 0, tm.itemsize);
      }
    }
  }
  m->tx -= n * tm.itemsize;
  mbar_moved(*m);
}
}  // namespace as_emu

inline void as_mbar_init(unsigned bar, unsigned count) {
  using namespace as_emu;
  int i = 0;
  while (i < n_mbars && mbar_at[i] && mbar_at[i] != bar + 1) ++i;
  if (i == 64) return fail(7, "more than 64 live mbarriers");
  if (i == n_mbars) ++n_mbars;
  mbar_at[i] = bar + 1;
  mbars[i] = {(long long)count, (long long)count, 0, 0};
}
inline void as_mbar_fence_init() {}
inline void as_mbar_expect(unsigned bar, unsigned bytes) {
  if (auto* m = as_emu::mbar(bar, "arrives on")) {
    m->tx += bytes;
    --m->pending;
    as_emu::mbar_moved(*m);
  }
}
inline void as_mbar_arrive(unsigned bar) {
  if (auto* m = as_emu::mbar(bar, "arrives on")) {
    --m->pending;
    as_emu::mbar_moved(*m);
  }
}
inline bool as_mbar_try_wait(unsigned bar, unsigned parity) {
  auto* m = as_emu::mbar(bar, "waits on");
  if (!m || (m->phase & 1u) != parity) return true;
  as_emu::wait_turn();
  return as_emu::err_code != 0;  // an error ends the wait
}
inline void as_mbar_inval(unsigned bar) {
  for (int i = 0; i < as_emu::n_mbars; ++i)
    if (as_emu::mbar_at[i] == bar + 1) as_emu::mbar_at[i] = 0;
}
inline void as_tma_load1(unsigned dst, const as_tensor_map& tm, unsigned bar, int c0) {
  as_emu::tma_load<1>(dst, tm, bar, {c0});
}
inline void as_tma_load2(unsigned dst, const as_tensor_map& tm, unsigned bar, int c0, int c1) {
  as_emu::tma_load<2>(dst, tm, bar, {c0, c1});
}
inline void as_tma_load3(unsigned dst, const as_tensor_map& tm, unsigned bar, int c0, int c1,
                         int c2) {
  as_emu::tma_load<3>(dst, tm, bar, {c0, c1, c2});
}
inline void as_tma_load4(unsigned dst, const as_tensor_map& tm, unsigned bar, int c0, int c1,
                         int c2, int c3) {
  as_emu::tma_load<4>(dst, tm, bar, {c0, c1, c2, c3});
}
inline void as_tma_load5(unsigned dst, const as_tensor_map& tm, unsigned bar, int c0, int c1,
                         int c2, int c3, int c4) {
  as_emu::tma_load<5>(dst, tm, bar, {c0, c1, c2, c3, c4});
}
inline void as_bar_sync(int id, int threads) { as_emu::named_barrier(id, threads); }
template <int N> inline void as_wg_setmaxnreg_inc() {}
template <int N> inline void as_wg_setmaxnreg_dec() {}
inline void as_wg_fence_proxy() {}
inline void as_wg_mma_fence() {}
inline void as_wg_mma_commit() {}
template <int N> inline void as_wg_mma_wait() {}

AS_API const char* as_error() { return as_emu::err_msg; }
AS_API long long as_warning_count(int kind) {
  return kind == 0 ? as_emu::n_uninit : as_emu::n_dup;
}
AS_API const char* as_warning(int kind) {
  return kind == 0 ? as_emu::uninit_msg : as_emu::dup_msg;
}
"""
