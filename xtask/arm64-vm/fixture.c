// Fixture for `cargo xtask test-arm64-vm`, rewritten by `rewriter` (AArch64 backend)
// with --functions 'fx_*' --functions main. Threads 1..3 call fx_mid(v) 50*t+7 times
// with v = t<<20 | i, and fx_mid calls fx_leaf(v); then main calls fx_mid(i) 13 times
// and returns 0. Every thread prints its tid; xtask checks the trace against them.
// With an argument ("solo"), main calls fx_mid(i) 20 times and exits at once.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) long fx_leaf(long x) { return x * 3 + sink; }

// Not a leaf: with -mbranch-protection=standard it starts with paciasp.
__attribute__((noinline)) long fx_mid(long x) {
    long r = fx_leaf(x);
    sink += r;
    return r + 1;
}

__attribute__((noinline)) void *fx_worker(void *arg) {
    long no = (long)arg;
    for (long i = 0; i < 50 * no + 7; i++)
        fx_mid((no << 20) | i);
    printf("UTPROG thread %ld tid %ld\n", no, (long)syscall(SYS_gettid));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        // "solo": the main thread alone, straight from exec to exit_group with no
        // blocking call, so the kernel's saved thread pointer (arm64: tp_value) is
        // likely still the one from before libc installed its TLS. Prints nothing; xtask
        // takes the pid as the main thread's tid.
        for (long i = 0; i < 20; i++)
            fx_mid(i);
        _exit(0);
    }
    pthread_t th[3];
    for (long k = 0; k < 3; k++)
        pthread_create(&th[k], 0, fx_worker, (void *)(k + 1));
    for (int k = 0; k < 3; k++)
        pthread_join(th[k], 0);
    for (long i = 0; i < 13; i++)
        fx_mid(i);
    printf("UTPROG main tid %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    return 0;
}
