//! eBPF side of utrace: drains the per-thread record buffers of instrumented binaries
//! into the `EVENTS` ring buffer (see the design notes in tracer-common). This file
//! holds only the entry points; their bodies are in `programs/`.
//!
//! Programs (user space loads them by these names, `tracer_common::ebpf::PROG_*`):
//! - `flush`: uprobe on the injected flush function, slot pointer in the second
//!   argument register; drains `[start, cur)` and resets the buffer (the flush code
//!   resets it too if we did not), and learns the process's RW area on the registration
//!   call (`cur == start`).
//! - `flush_s`: `flush` as a sleepable program: non-resident buffer pages are faulted
//!   in (used when the kernel accepts it).
//! - `site`: uprobe on an unpatchable site, cookie = `ebpf::site_cookie` (binary
//!   ordinal, record selector, site id); drains and resets the thread's buffer of that
//!   binary (keeps order), then emits the record an inline stub would (a memory site's
//!   effective address and a USDT probe's arguments from its `OPERANDS` descriptors,
//!   the arguments after the second in `FLAG_USDT_MORE` records of the same chunk).
//!
//! Flush and site leave a buffer alone while `slot.inflight != 0` (a signal handler
//! interrupted a stub that is still writing its record).
//! - `thread_exit` (syscalls:sys_enter_exit): drains and releases the thread's slots.
//! - `group_exit` (syscalls:sys_enter_exit_group) and `killed` (signal:signal_deliver,
//!   SIGKILL or a crash signal): drain the thread's slots before do_exit, while user
//!   memory is still mapped (kernels before 6.16 run `sched_process_exit` after
//!   `exit_mm`).
//! - `task_exit` (sched:sched_process_exit): read-only drain of what is left (threads
//!   killed by exit_group or a signal), and forgets finished processes.
//! - `exit_step`: one step of an exit drain (one slot), reached only by tail calls
//!   through `EXIT_STEPS` from the exit programs and itself.
//! - `fork` (sched:sched_process_fork): children of traced processes are traced.
//! - `exec` (sched:sched_process_exec) and `mmap` (syscalls:sys_enter_mmap, an
//!   executable file): tell the tracer to look for new instrumented binaries
//!   (`CHUNK_KIND_MAPPED`).
//!
//! "Reset" and "release" write the slot in user memory (bpf_probe_write_user) when the
//! loader sets `WRITE_USER`; kernels in lockdown (integrity) refuse that helper, and
//! then the programs never write user memory: the `DRAINED` map remembers how far each
//! slot was delivered and the next drain starts there (see `slots::drain_slot`).
//!
//! Modules, each using only those before it: `atomic`, `user` → `maps` → `books` →
//! `arch` → `filter` → `strings` → `drain` → `slots` → `tables` → `programs`.
//!
//! **What the verifier costs.** It is the kernel's share of a session's fixed cost
//! (0.2–0.3 s each for `flush_s`, `site` and `exit_step` on Linux 6.18; the loader
//! verifies the three in parallel threads). A drain under the exit walk's loop under
//! the chunk loop cost it seconds per program, so the exit programs tail-call
//! `exit_step` (`programs/exit.rs`), and the drain is a global function:
//! `slots::drain_slot` is exported as two BPF global functions (`drain_slot_sleepable`,
//! `drain_slot_atomic`; `build.rs` exports them), checked once for any scalar arguments
//! rather than for every state a caller reaches them in. So are the chunk copy
//! (`drain::emit_chunk_*`, its four size classes) and the string pass's read of one
//! pointer (`strings::name_string`), which sit in `bpf_loop` callbacks: Linux 6.7 and
//! later walk a callback until its states converge, and inlined there they took the
//! programs back to 240–320 K processed instructions and 1.0–1.6 s (`tracer record`
//! logs each program's count at debug level). Their arguments stay scalars (a global
//! function is verified without its callers' knowledge: a pointer argument is known
//! only by its type and may be null): `emit_chunk` packs count, hold and cause into
//! one, and `name_string` finds its state in the per-CPU scratch the drain holds. The
//! deepest chain (`flush` → `drain_slot_*` → `filter_one` → `strings::name_string`)
//! takes all of the verifier's 512 stack bytes on Linux 6.1, which counts callback
//! frames, each rounded up to 32 bytes (96 + 288 + 32 + 64 + 32): `filter_one` keeps
//! its record in the scratch, the string pass's state is there too, and no array or
//! header is built on the stack (checked by `cargo xtask test-arm64-vm`, whose guest
//! runs 6.1). The three large programs process 90–110 K instructions each, 0.2–0.3 s.
#![no_std]
#![no_main]
// Inline asm for the atomics (src/atomic.rs); this crate is only built with nightly.
#![feature(asm_experimental_arch)]

/// A BPF global function in two exported copies, one for sleepable programs and one
/// for the others (an exported function has one body, so not one generic), each
/// calling `$inner::<true>` or `::<false>` with its scalar arguments. Exported by
/// build.rs; why global: `slots::drain_slot_sleepable`.
macro_rules! global_pair {
    ($(#[$doc:meta])* $sleepable:ident, $atomic:ident => $inner:ident($($arg:ident: $t:ty),*)) => {
        $(#[$doc])*
        /// (Sleepable programs.)
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $sleepable($($arg: $t),*) -> i64 {
            $inner::<true>($($arg),*)
        }

        $(#[$doc])*
        /// (Other programs.)
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $atomic($($arg: $t),*) -> i64 {
            $inner::<false>($($arg),*)
        }
    };
}

mod arch;
mod atomic;
mod books;
mod drain;
mod duration;
mod filter;
mod maps;
mod programs;
mod slots;
mod strings;
mod tables;
mod user;

use aya_ebpf::{
    macros::{tracepoint, uprobe},
    programs::{ProbeContext, TracePointContext},
};

use crate::programs::{exit, process};

#[uprobe]
pub fn flush(ctx: ProbeContext) -> u32 {
    programs::flush::flush::<false>(&ctx)
}

#[uprobe(sleepable)]
pub fn flush_s(ctx: ProbeContext) -> u32 {
    programs::flush::flush::<true>(&ctx)
}

#[uprobe]
pub fn site(ctx: ProbeContext) -> u32 {
    programs::site::site(&ctx)
}

#[tracepoint]
pub fn thread_exit(ctx: TracePointContext) -> u32 {
    exit::thread_exit(&ctx)
}

#[tracepoint]
pub fn group_exit(ctx: TracePointContext) -> u32 {
    exit::group_exit(&ctx)
}

#[tracepoint]
pub fn killed(ctx: TracePointContext) -> u32 {
    exit::killed(&ctx)
}

#[tracepoint]
pub fn task_exit(ctx: TracePointContext) -> u32 {
    exit::task_exit(&ctx)
}

#[tracepoint]
pub fn exit_step(ctx: TracePointContext) -> u32 {
    exit::exit_step(&ctx)
}

#[tracepoint]
pub fn fork(ctx: TracePointContext) -> u32 {
    process::fork(&ctx)
}

#[tracepoint]
pub fn exec(_ctx: TracePointContext) -> u32 {
    process::exec()
}

#[tracepoint]
pub fn mmap(ctx: TracePointContext) -> u32 {
    process::mmap(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// bpf_probe_write_user and bpf_probe_read_user are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
