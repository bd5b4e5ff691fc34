# `cargo xtask bench --only python`: a recursive function called often (fib(N) makes
# 2 fib(N+1) - 1 calls); prints fib(N), and to stderr the seconds the calls took (the
# program's own time under a tracer, without the tracer's start-up and end).
import sys
import time


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


t = time.perf_counter()
print(fib(int(sys.argv[1])))
print(f"fib_seconds={time.perf_counter() - t:.6f}", file=sys.stderr)
