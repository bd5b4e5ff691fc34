/* Readers benchmark workload with calls left by unwinding: N iterations of main's loop
 * calling note(i), then outer(i), which calls inner(2i) and inner(2i + 1). In 3
 * iterations of 20 the second inner() leaves through a longjmp back to main: that call
 * of inner and that call of outer have an entry and no exit (about 10 % of all calls);
 * they end where the longjmp lands (setjmp's return in main, a landing site). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

static jmp_buf back;

__attribute__((noinline)) long inner(long y) {
    if (y % 2 == 1 && (y / 2) % 20 < 3)
        longjmp(back, 1);
    return y * 3 + 1;
}
__attribute__((noinline)) long note(long x) { return x ^ 0x5a; }

/* The xor keeps a few instructions after the last call, so the exit is patched inline. */
__attribute__((noinline)) long outer(long x) { return (inner(2 * x) + inner(2 * x + 1)) ^ x; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    static volatile long sum, left, i;
    for (i = 0; i < n; i++) {
        if (setjmp(back)) {
            left++;
            continue;
        }
        sum += note(i);
        sum += outer(i);
    }
    printf("%ld %ld\n", sum, left);
    return 0;
}
