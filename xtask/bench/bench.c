/* Fixture of `cargo xtask bench`: calls the noinline function hit() N times and measures
 * itself with clock_gettime(CLOCK_MONOTONIC) around the loop; prints
 * "ns_per_iter <ns> iterations <N>".
 *
 * Built plain: the untraced loop; rewritten by the rewriter: the inline stub (with and
 * without the tracer); unrewritten under a plain uprobe.
 * Built with -DUSDT: hit() holds a <sys/sdt.h> probe with its argument.
 * Built with -DHANDWRITTEN: hit() itself stores the same 32-byte record the stub stores
 * (site, flags, rdtsc, first argument, return address) into a thread-local buffer, bumps
 * the pointer and wraps when full: what an inline store costs at best.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile long sink;

#ifdef HANDWRITTEN
typedef struct {
    uint32_t site, flags;
    uint64_t time, value, aux;
} rec_t;
#define NREC 4096 /* records per buffer, as the rewriter's default */
static __thread rec_t buf[NREC] __attribute__((aligned(64)));
static __thread rec_t *cur;

__attribute__((noinline)) void hit(long i) {
    rec_t *c = cur;
    if (__builtin_expect(c == NULL, 0))
        c = buf;
    rec_t *next = c + 1;
    /* reserve first (store the bumped pointer), reset when the buffer is full */
    cur = next == buf + NREC ? buf : next;
    __asm__ volatile("rdtsc\n\t"
                     "shl $32, %%rdx\n\t"
                     "or %%rdx, %%rax\n\t"
                     "movl $1, 0(%[c])\n\t"   /* site */
                     "movl $0, 4(%[c])\n\t"   /* flags */
                     "mov %%rax, 8(%[c])\n\t" /* time */
                     "mov %[v], 16(%[c])\n\t" /* value = first argument */
                     "mov %[ra], 24(%[c])\n\t" /* aux = return address */
                     :
                     : [c] "r"(c), [v] "r"(i), [ra] "r"(__builtin_return_address(0))
                     : "rax", "rdx", "memory");
    sink += i;
}
#elif defined(USDT)
/* A USDT probe in hit(): the inline stub (rewriter --sites usdt), our uprobe on it
 * (--force-uprobe) and bpftrace's usdt probe compare on the same binary. */
#include <sys/sdt.h>
__attribute__((noinline)) void hit(long i) {
    DTRACE_PROBE1(bench, hit, i);
    sink += i;
}
#else
__attribute__((noinline)) void hit(long i) { sink += i; }
#endif

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    /* warm up: thread registration, buffer pages, one full buffer */
    for (long i = 0; i < 4096; i++)
        hit(i);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        hit(i);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("ns_per_iter %.3f iterations %ld\n", ns / (double)n, n);
    return 0;
}
