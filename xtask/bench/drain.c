/* Fixture of `cargo xtask bench` (drain throughput): T threads each call the noinline
 * function hot() N times, as fast as they can, so that the rewritten binary produces
 * records faster than anything downstream (flush -> eBPF -> ring buffer -> tracer ->
 * trace file) can take them. hot() does nothing: the loop costs a call and the stub.
 *
 * Usage: drain T N. Each thread first calls rare() once (a second instrumented
 * function: a `--functions rare` filter then matches a site and drops every record of
 * hot()), then waits at a barrier; main measures from the barrier until every thread
 * has been joined (its last partial buffer is drained when it exits) with
 * clock_gettime(CLOCK_MONOTONIC), and prints
 *   "drain_loop_ns <ns> threads <T> iterations <N> user_us <u> sys_us <s>"
 * with the process's CPU time (getrusage RUSAGE_SELF, all threads; the eBPF flush
 * program runs in the producing threads' context and counts as their system time).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

__attribute__((noipa)) void hot(long i) { __asm__ volatile("" : : "r"(i) : "memory"); }
__attribute__((noipa)) void rare(long i) { __asm__ volatile("" : : "r"(i) : "memory"); }

static long n_iter;
static pthread_barrier_t start;

static void *worker(void *arg) {
    rare((long)arg);
    pthread_barrier_wait(&start);
    for (long i = 0; i < n_iter; i++)
        hot(i);
    return NULL;
}

int main(int argc, char **argv) {
    int t = argc > 1 ? atoi(argv[1]) : 1;
    n_iter = argc > 2 ? atol(argv[2]) : 10000000;
    if (t < 1 || t > 64 || n_iter < 0) {
        fprintf(stderr, "usage: drain T N (1 <= T <= 64)\n");
        return 2;
    }
    pthread_t th[64];
    pthread_barrier_init(&start, NULL, (unsigned)t + 1);
    for (int k = 0; k < t; k++)
        if (pthread_create(&th[k], NULL, worker, (void *)(long)k) != 0) {
            perror("pthread_create");
            return 1;
        }
    struct timespec a, b;
    pthread_barrier_wait(&start);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int k = 0; k < t; k++)
        pthread_join(th[k], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long ns = (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
    printf("drain_loop_ns %lld threads %d iterations %ld user_us %lld sys_us %lld\n", ns, t,
           n_iter, (long long)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec,
           (long long)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec);
    return 0;
}
