/* One atomic word passed back and forth between two threads pinned to CPUs A and B (default 0
 * and 1): the mean round trip in nanoseconds, how long a cache line takes from one core to the
 * other and back. On a VM its vCPUs can sit close (shared cache) or far apart on the host, and
 * that can change while a benchmark runs; benchmarks/baseline.py prints it in each header.
 *     cc -O2 -pthread benchmarks/core_pingpong.c -o pingpong && ./pingpong [A B] */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 100000

static _Atomic long word __attribute__((aligned(64)));

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *echo(void *arg) {
    if (pin(*(int *)arg) != 0) return (void *)1;
    for (long i = 0; i < ROUNDS; i++) {
        while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 1) {}
        atomic_store_explicit(&word, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;
    if (pin(a) != 0) { fprintf(stderr, "cannot pin to CPU %d\n", a); return 1; }
    pthread_t t;
    if (pthread_create(&t, NULL, echo, &b) != 0) return 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < ROUNDS; i++) {
        atomic_store_explicit(&word, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    void *failed;
    pthread_join(t, &failed);
    if (failed) { fprintf(stderr, "cannot pin to CPU %d\n", b); return 1; }
    printf("%.0f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / ROUNDS);
    return 0;
}
