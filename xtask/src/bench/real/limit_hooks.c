/* The hand-written limit of issue 29: what -finstrument-functions hooks cost at best.
 * Each hook stores one 16-byte record {function | exit bit, TSC} through an
 * initial-exec TLS pointer into a per-thread 1 MiB buffer that wraps (no drain, as
 * funtrace does); -DLIMIT_NO_TSC stores the call site instead of the time. At exit
 * the records made are printed to stderr: "limit: N records". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <x86intrin.h>

#define NOINST __attribute__((no_instrument_function))
#define TLS __attribute__((tls_model("initial-exec"))) static __thread
#define RECS (1u << 16)

struct rec { uintptr_t fn; uint64_t t; };

TLS struct rec *cur;
TLS struct rec *end;
TLS uint64_t wraps;
static struct rec *main_start;
static uint64_t *main_wraps;
static struct rec **main_cur;

NOINST static struct rec *wrap(void) {
    if (!end) {
        struct rec *b = aligned_alloc(64, RECS * sizeof *b);
        if (!b) abort();
        end = b + RECS;
        if (!main_start) { main_start = b; main_wraps = &wraps; main_cur = &cur; }
        return b;
    }
    wraps++;
    return end - RECS;
}

NOINST static inline void put(uintptr_t fn, void *site) {
    struct rec *p = cur;
    if (__builtin_expect(p == end, 0)) p = wrap();
    p->fn = fn;
#ifdef LIMIT_NO_TSC
    p->t = (uintptr_t)site;
#else
    (void)site;
    p->t = __rdtsc();
#endif
    cur = p + 1;
}

NOINST void __cyg_profile_func_enter(void *fn, void *site) { put((uintptr_t)fn, site); }
NOINST void __cyg_profile_func_exit(void *fn, void *site) { put((uintptr_t)fn | 1, site); }

NOINST __attribute__((destructor)) static void report(void) {
    if (main_start)
        fprintf(stderr, "limit: %llu records\n",
                (unsigned long long)(*main_wraps * RECS + (uint64_t)(*main_cur - main_start)));
}
