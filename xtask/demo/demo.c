/* Demo program for `cargo xtask demo`: a few functions, two threads, a recursive fib.
 * The rewriter instruments every function entry; `tracer report` then shows how often
 * each function ran on which thread. */
#include <pthread.h>
#include <stdio.h>

volatile long sink;

__attribute__((noinline)) long square(long x) {
    sink += x;
    return x * x;
}

__attribute__((noinline)) long fib(long n) {
    if (n < 2)
        return n;
    long a = fib(n - 1);
    long b = fib(n - 2);
    return a + b;
}

__attribute__((noinline)) long sum_of_squares(long n) {
    long s = 0;
    for (long i = 1; i <= n; i++)
        s += square(i);
    return s;
}

struct job {
    long n;
    long result;
};

void *worker(void *arg) {
    struct job *j = arg;
    j->result = sum_of_squares(j->n);
    return NULL;
}

int main(void) {
    struct job a = {.n = 1000}, b = {.n = 2000};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, worker, &a);
    pthread_create(&tb, NULL, worker, &b);
    long f = fib(20);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    printf("fib(20) = %ld\n", f);
    printf("sum of squares 1..1000 = %ld (thread 1)\n", a.result);
    printf("sum of squares 1..2000 = %ld (thread 2)\n", b.result);
    return 0;
}
