// Hand-made stand-in for an AArch64 binary processed by the utrace rewriter, for
// `cargo xtask test-arm64-vm` until the rewriter's AArch64 backend can produce real
// fixtures. It has what a rewritten binary has: an RW area laid out as in
// tracer-common/src/layout.rs, a `utrace_flush` function whose first instruction is a
// NOP (the tracer's uprobe) taking the slot pointer in x9, and "stubs" (trace()) that
// append 32-byte records to the calling thread's buffer (thread pointer = tpidr_el0,
// time = cntvct_el0). xtask adds the .note.utrace metadata with objcopy.
//
// Run: main records 37, threads 1..3 record 100*t+7 each (and call the uprobe site
// probe_target every 50th record), a 4th thread records 5 and blocks until exit_group,
// main records 13 more and exits with status 3. Every thread prints one line with its
// tid and counts; xtask checks the trace against them.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Written from tracer-common by xtask (arm64_vm/standin.rs) next to this build. */
#include "utrace_layout.h"

#define RT_BINARY_ID 0x4152363456540001ULL
#define PRE_TLS_OFF 0x1000
#define INDEX_OFF 0x2000
#define INDEX_ENTRIES 65536
#define SLOTS_OFF (INDEX_OFF + INDEX_ENTRIES * 4)
#define NSLOTS 64
#define BUF_RECORDS 16
#define BUF_BYTES (BUF_RECORDS * 32)
#define BUF_STRIDE (BUF_BYTES + 8 * 32)
#define BUFS_OFF (((SLOTS_OFF + NSLOTS * 64) + 0xffff) & ~0xffff)
#define KEY_FREE 0
#define KEY_TOMBSTONE 1

struct rw_header {
    uint64_t magic;
    uint32_t version, nslots;
    uint64_t buf_bytes, bufs_off, binary_id, no_slot_drops, registrations, pre_tls;
};
struct slot {
    uint64_t key, cur, end, start, rw_base, binary_id;
    uint32_t owner_tid, generation;
    uint64_t inflight;
};
struct record {
    uint32_t site, flags;
    uint64_t time, value, aux;
};
/* The copies above, checked against tracer-common's layout. */
_Static_assert(PRE_TLS_OFF == UTRACE_PRE_TLS_OFF, "PRE_TLS_OFF");
_Static_assert(INDEX_OFF == UTRACE_INDEX_OFF, "INDEX_OFF");
_Static_assert(INDEX_ENTRIES == UTRACE_INDEX_ENTRIES, "INDEX_ENTRIES");
_Static_assert(SLOTS_OFF == UTRACE_SLOTS_OFF, "SLOTS_OFF");
_Static_assert(BUF_STRIDE == BUF_BYTES + UTRACE_BUF_SLACK_RECORDS * UTRACE_RECORD_SIZE, "stride");
_Static_assert((BUFS_OFF & (UTRACE_BUF_ALIGN - 1)) == 0, "BUFS_OFF");
_Static_assert(KEY_FREE == UTRACE_KEY_FREE && KEY_TOMBSTONE == UTRACE_KEY_TOMBSTONE, "keys");
_Static_assert(offsetof(struct rw_header, magic) == UTRACE_RWH_MAGIC, "magic");
_Static_assert(offsetof(struct rw_header, version) == UTRACE_RWH_VERSION, "version");
_Static_assert(offsetof(struct rw_header, nslots) == UTRACE_RWH_NSLOTS, "nslots");
_Static_assert(offsetof(struct rw_header, buf_bytes) == UTRACE_RWH_BUF_BYTES, "buf_bytes");
_Static_assert(offsetof(struct rw_header, bufs_off) == UTRACE_RWH_BUFS_OFF, "bufs_off");
_Static_assert(offsetof(struct rw_header, binary_id) == UTRACE_RWH_BINARY_ID, "binary_id");
_Static_assert(offsetof(struct rw_header, no_slot_drops) == UTRACE_RWH_NO_SLOT_DROPS, "drops");
_Static_assert(offsetof(struct rw_header, registrations) == UTRACE_RWH_REGISTRATIONS, "regs");
_Static_assert(offsetof(struct rw_header, pre_tls) == UTRACE_RWH_PRE_TLS, "pre_tls");
_Static_assert(sizeof(struct rw_header) <= UTRACE_RWH_SIZE, "rw_header");
_Static_assert(sizeof(struct slot) == UTRACE_SLOT_SIZE, "struct slot");
_Static_assert(offsetof(struct slot, key) == UTRACE_SLOT_KEY, "slot.key");
_Static_assert(offsetof(struct slot, cur) == UTRACE_SLOT_CUR, "slot.cur");
_Static_assert(offsetof(struct slot, end) == UTRACE_SLOT_END, "slot.end");
_Static_assert(offsetof(struct slot, start) == UTRACE_SLOT_START, "slot.start");
_Static_assert(offsetof(struct slot, rw_base) == UTRACE_SLOT_RW_BASE, "slot.rw_base");
_Static_assert(offsetof(struct slot, binary_id) == UTRACE_SLOT_BINARY_ID, "slot.binary_id");
_Static_assert(offsetof(struct slot, owner_tid) == UTRACE_SLOT_OWNER_TID, "slot.owner_tid");
_Static_assert(offsetof(struct slot, generation) == UTRACE_SLOT_GENERATION, "slot.generation");
_Static_assert(offsetof(struct slot, inflight) == UTRACE_SLOT_INFLIGHT, "slot.inflight");
_Static_assert(sizeof(struct record) == UTRACE_RECORD_SIZE, "struct record");
_Static_assert(offsetof(struct record, site) == UTRACE_RECORD_SITE, "record.site");
_Static_assert(offsetof(struct record, flags) == UTRACE_RECORD_FLAGS, "record.flags");
_Static_assert(offsetof(struct record, time) == UTRACE_RECORD_TIME, "record.time");
_Static_assert(offsetof(struct record, value) == UTRACE_RECORD_VALUE, "record.value");
_Static_assert(offsetof(struct record, aux) == UTRACE_RECORD_AUX, "record.aux");

struct rw_area {
    struct rw_header hdr;
    char pad0[INDEX_OFF - sizeof(struct rw_header)];
    uint32_t index[INDEX_ENTRIES];
    struct slot slots[NSLOTS];
    char pad1[BUFS_OFF - SLOTS_OFF - NSLOTS * 64];
    char bufs[NSLOTS][BUF_STRIDE];
};

__attribute__((aligned(65536), used)) struct rw_area utrace_rw = {
    .hdr = {
        .magic = 0x3130575243525455ULL, /* "UTRCRW01" */
        .version = 1,
        .nslots = NSLOTS,
        .buf_bytes = BUF_BYTES,
        .bufs_off = BUFS_OFF,
        .binary_id = RT_BINARY_ID,
    },
};

// flush(x9 = slot), as the rewriter's AArch64 runtime: NOP (uprobe point), then reset
// the buffer unless a record is in flight or it is no longer full. Clobbers x10, x11.
// The slot's field offsets come from utrace_layout.h.
#define STR_(x) #x
#define STR(x) STR_(x)
__asm__(".text\n"
        ".globl utrace_flush\n"
        ".type utrace_flush, %function\n"
        ".p2align 2\n"
        "utrace_flush:\n"
        "  nop\n"
        "  ldr x10, [x9, #" STR(UTRACE_SLOT_INFLIGHT) "]\n"
        "  cbnz x10, 1f\n"
        "  ldr x10, [x9, #" STR(UTRACE_SLOT_CUR) "]\n"
        "  ldr x11, [x9, #" STR(UTRACE_SLOT_END) "]\n"
        "  sub x10, x10, x11\n"
        "  tbnz x10, #63, 1f\n"
        "  ldr x10, [x9, #" STR(UTRACE_SLOT_START) "]\n"
        "  str x10, [x9, #" STR(UTRACE_SLOT_CUR) "]\n"
        "1: ret\n"
        ".size utrace_flush, .-utrace_flush\n");

static inline void do_flush(struct slot *s) {
    register struct slot *x9 __asm__("x9") = s;
    __asm__ volatile("bl utrace_flush" : "+r"(x9) : : "x10", "x11", "x30", "memory");
}

static inline uint64_t thread_pointer(void) {
    uint64_t tp;
    __asm__ volatile("mrs %0, tpidr_el0" : "=r"(tp));
    return tp;
}

static inline uint64_t counter(void) {
    uint64_t t;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(t));
    return t;
}

static struct slot *register_thread(uint64_t tp) {
    for (int i = 2; i < NSLOTS; i++) {
        struct slot *s = &utrace_rw.slots[i];
        uint64_t k = s->key;
        if ((k == KEY_FREE || k == KEY_TOMBSTONE) && __sync_bool_compare_and_swap(&s->key, k, tp)) {
            uint64_t start = (uint64_t)utrace_rw.bufs[i];
            s->start = start;
            s->cur = start;
            s->end = start + BUF_BYTES;
            s->rw_base = (uint64_t)&utrace_rw;
            s->binary_id = RT_BINARY_ID;
            s->owner_tid = (uint32_t)syscall(SYS_gettid);
            s->generation++;
            s->inflight = 0;
            utrace_rw.index[(tp >> 16) & 0xffff] = (uint32_t)(i * 64);
            __sync_fetch_and_add(&utrace_rw.hdr.registrations, 1);
            do_flush(s); // empty drain: tells eBPF about this RW area
            return s;
        }
    }
    return 0;
}

static struct slot *lookup(uint64_t tp) {
    struct slot *s = (struct slot *)((char *)utrace_rw.slots + utrace_rw.index[(tp >> 16) & 0xffff]);
    if (s->key == tp)
        return s;
    for (int i = 2; i < NSLOTS; i++)
        if (utrace_rw.slots[i].key == tp)
            return &utrace_rw.slots[i];
    return 0;
}

// What an inline stub does at a function entry.
__attribute__((noinline)) static void trace(uint32_t site, uint64_t value, uint64_t aux) {
    uint64_t tp = thread_pointer();
    struct slot *s = lookup(tp);
    if (!s) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        s = lookup(tp);
        if (!s)
            s = register_thread(tp);
        pthread_sigmask(SIG_SETMASK, &old, 0);
    }
    if (!s) {
        __sync_fetch_and_add(&utrace_rw.hdr.no_slot_drops, 1);
        return;
    }
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_RELAXED);
    __asm__ volatile("" ::: "memory");
    uint64_t cur = __atomic_fetch_add(&s->cur, 32, __ATOMIC_RELAXED), next = cur + 32;
    struct record *r = (struct record *)cur;
    r->site = site;
    r->flags = 0;
    r->time = counter();
    r->value = value;
    r->aux = aux;
    __asm__ volatile("" ::: "memory");
    __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELAXED);
    if (next >= s->end)
        do_flush(s);
}

enum { SITE_WORK = 0, SITE_PROBE = 1, SITE_MAIN = 2 };

static volatile long sink;
__attribute__((noinline)) void probe_helper(long x) { sink += x; }

// An "unpatchable" function: a uprobe at its entry (after its landing pad, as the
// rewriter places it). Not a leaf, so with -mbranch-protection=standard it starts with
// paciasp and the uprobe sees a signed x30.
__attribute__((noinline)) long probe_target(long x) {
    probe_helper(x);
    return x + 1;
}

__attribute__((noinline)) static void work(uint64_t v) { trace(SITE_WORK, v, 0); }

struct job {
    int no, n, block, fd;
};
static volatile int blocker_ready;

__attribute__((noinline)) void *thread_main(void *arg) {
    struct job *j = arg;
    long probes = 0;
    for (int i = 0; i < j->n; i++) {
        uint64_t v = ((uint64_t)j->no << 20) | (uint64_t)i;
        work(v);
        if (!j->block && i % 50 == 0) {
            probe_target((long)v);
            probes++;
        }
    }
    printf("UTPROG thread %d tid %ld work %d probes %ld\n", j->no, syscall(SYS_gettid), j->n, probes);
    fflush(stdout);
    if (j->block) { // still alive, records buffered, when main calls exit_group
        __atomic_store_n(&blocker_ready, 1, __ATOMIC_SEQ_CST);
        char c;
        read(j->fd, &c, 1);
    }
    return 0;
}

int main(void) {
    for (int i = 0; i < 37; i++)
        trace(SITE_MAIN, i, 0);
    static struct job jobs[3];
    pthread_t th[3];
    for (int k = 0; k < 3; k++) {
        jobs[k] = (struct job){.no = k + 1, .n = 100 * (k + 1) + 7, .fd = -1};
        pthread_create(&th[k], 0, thread_main, &jobs[k]);
    }
    for (int k = 0; k < 3; k++)
        pthread_join(th[k], 0);
    int fds[2];
    if (pipe(fds))
        return 1;
    static struct job blocker = {.no = 4, .n = 5, .block = 1};
    blocker.fd = fds[0];
    pthread_t bt;
    pthread_create(&bt, 0, thread_main, &blocker);
    while (!__atomic_load_n(&blocker_ready, __ATOMIC_SEQ_CST))
        usleep(1000);
    for (int i = 37; i < 50; i++)
        trace(SITE_MAIN, i, 0);
    printf("UTPROG main tid %ld main 50 registrations %lu no_slot_drops %lu\n", syscall(SYS_gettid),
           (unsigned long)utrace_rw.hdr.registrations, (unsigned long)utrace_rw.hdr.no_slot_drops);
    fflush(stdout);
    exit(3);
}
