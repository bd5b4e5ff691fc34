/* Readers benchmark workload: N iterations of outer() calling inner() twice, every
 * function entry and exit traced: 6 records per iteration, nested calls for the
 * call pairing, the Perfetto slices and the flame graph. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long inner(long x) { return x * 3 + 1; }
/* The xor keeps a few instructions after the last call, so the exit is patched inline. */
__attribute__((noinline)) long outer(long x) { return (inner(x) + inner(x + 1)) ^ x; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += outer(i);
    printf("%ld\n", sum);
    return 0;
}
