//! `site`: the uprobe on an unpatchable site (cookie = `ebpf::site_cookie`: binary
//! ordinal, record selector, site id) drains the thread's buffer of that binary (keeps
//! order), then emits the record an inline stub would: a memory site's effective
//! address and a USDT probe's arguments from its `OPERANDS` descriptors.
//!
//! The tracer attaches uprobes in descending site id: the kernel runs the consumers of
//! one address last attached first, so sites sharing an instruction record in id order,
//! as their inline stub would. Registers are read at constant context offsets into a
//! local array; an operand set holds up to 12 operands; a probe's arguments 3.. become
//! extra records of the same chunk. A call uprobe site records the instruction's
//! address, not the target. The record carries `FLAG_UPROBE | FLAG_KTIME`.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_attach_cookie, bpf_ktime_get_ns},
    },
    programs::ProbeContext,
};
use tracer_common::{
    CAUSE_UPROBE_SITE, CHUNK_KIND_UPROBE, ChunkHeader, FLAG_KTIME, FLAG_UPROBE,
    FLAG_USDT_INDEX_SHIFT, FLAG_USDT_MORE, Record, STAT_CHUNKS, STAT_READ_ERRORS,
    STAT_RECORDS_DELIVERED, STAT_RECORDS_DROPPED, STAT_RECORDS_FILTERED, STAT_RECORDS_PRODUCED,
    ebpf::{
        SEL_BLOCK, SEL_CALL, SEL_EXIT, SEL_MEMORY, SEL_USDT, cookie_ordinal, cookie_selector,
        operand_key,
    },
    operand::{
        MAX_OPERAND_RECORDS, MAX_OPERANDS, OP_ADDR, OP_IMM, OP_LOAD, OP_REG, OPF_HIGH8, OPF_SIGNED,
        OPF_STRIP_PAC, OPF_TP, Operand, OperandSet, PAC_BITS,
    },
};

use super::is_target;
use crate::{
    arch::{self, NREGS, thread_pointer},
    books::{next_seq, stat_add},
    filter,
    maps::{BINARIES, EVENTS, OPERANDS},
    slots::{AFTER_RESET, drain_slot},
    tables::find_binary_slot,
    user::read_user,
};

/// One uprobe-site event as it goes into the ring buffer: its record and, for a USDT
/// probe of more than two arguments, the `FLAG_USDT_MORE` records after it (the
/// header's `count` says how many are valid).
#[repr(C)]
struct UprobeChunk<const N: usize> {
    header: ChunkHeader,
    records: [Record; N],
}

/// What every record of a uprobe-site event shares, and the first record's values
/// from the selector's registers.
struct Event {
    pid_tid: u64,
    binary_id: u64,
    site: u32,
    value: u64,
    aux: u64,
    /// The thread pointer (`%fs:`-relative operands).
    tp: u64,
}

/// The uprobe of an unpatchable site.
#[inline(always)]
pub(crate) fn site(ctx: &ProbeContext) -> u32 {
    let pid_tid = bpf_get_current_pid_tgid();
    let tgid = (pid_tid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    // SAFETY: ctx is this program's context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let binary_id = BINARIES.get(cookie_ordinal(cookie)).copied().unwrap_or(0);

    // Records the inline stubs of this binary buffered before this site come first.
    let tp = thread_pointer();
    if binary_id != 0
        && tp != 0
        && let Some((rw, slot)) = find_binary_slot(tgid, binary_id, tp)
    {
        let r = drain_slot::<false>(slot, rw, pid_tid, CAUSE_UPROBE_SITE, AFTER_RESET);
        if r < 0 {
            log_error!(ctx, "site: drain of slot {:x} failed: {}", slot, r);
        }
    }

    site_event(ctx, pid_tid, cookie, binary_id, tp);
    0
}

/// The record of a uprobe site. Its own frame: the event's locals must not sit under
/// the drain's frames (the verifier's 512-byte combined stack, callbacks included on
/// Linux 6.1).
#[inline(never)]
fn site_event(ctx: &ProbeContext, pid_tid: u64, cookie: u64, binary_id: u64, tp: u64) {
    // Every register is read unconditionally: the verifier refuses a context access
    // through a pointer that depends on the selector.
    let (arg, ret, pc) = (arch::first_arg(ctx), arch::return_value(ctx), arch::pc(ctx));
    let ra = arch::return_address(ctx);
    // SAFETY: reading a local; keeps LLVM from turning the choice into a ctx offset.
    let selector = unsafe { core::ptr::read_volatile(&cookie_selector(cookie)) };
    let (value, aux) = match selector {
        SEL_EXIT => (ret, ra),
        SEL_BLOCK => (pc, 0),
        // The effective address comes from the site's operands.
        SEL_MEMORY => (0, pc),
        // The arguments come from the site's operands.
        SEL_USDT => (0, 0),
        SEL_CALL => (0, pc),
        _ => (arg, ra),
    };
    let ops = match selector {
        SEL_MEMORY | SEL_USDT => {
            OPERANDS.get_ptr(operand_key(cookie_ordinal(cookie), cookie as u32))
        }
        _ => None,
    };
    let ev = Event {
        pid_tid,
        binary_id,
        site: cookie as u32,
        value,
        aux,
        tp,
    };
    match ops {
        // SAFETY: a live OPERANDS value.
        Some(set) if unsafe { (*set).count } > 2 => {
            emit::<MAX_OPERAND_RECORDS>(ctx, &ev, Some(set));
        }
        set => emit::<1>(ctx, &ev, set),
    }
}

/// Reserve room for `N` records, write the event (values from `set` when there is
/// one) and submit it. `N` = 1 unless `set` has more than two operands.
#[inline(always)]
fn emit<const N: usize>(ctx: &ProbeContext, ev: &Event, set: Option<*const OperandSet>) {
    let nrec = match set {
        // SAFETY: a live OPERANDS value.
        Some(s) => unsafe { (*s).records() }.min(N),
        None => 1,
    };
    stat_add(STAT_RECORDS_PRODUCED, nrec as u64);
    // SAFETY: no preconditions.
    let time = unsafe { bpf_ktime_get_ns() };
    if !filter::uprobe_record_passes(ev.pid_tid, ev.binary_id, ev.site, ev.value) {
        stat_add(STAT_RECORDS_FILTERED, nrec as u64);
        return;
    }
    filter::announce_comm(ev.pid_tid, ev.binary_id, time);
    let seq = next_seq();
    let Some(mut entry) = EVENTS.reserve::<UprobeChunk<N>>(0) else {
        stat_add(STAT_RECORDS_DROPPED, nrec as u64);
        return;
    };
    let p = entry.as_mut_ptr();
    let flags = FLAG_KTIME | FLAG_UPROBE;
    // SAFETY: p is the reservation, room for one UprobeChunk<N>; set is a live
    // OPERANDS value.
    unsafe {
        (*p).header = ChunkHeader::new(
            CHUNK_KIND_UPROBE,
            ev.pid_tid,
            ev.binary_id,
            CAUSE_UPROBE_SITE,
            time,
        )
        .with_records(nrec as u32, seq);
        (*p).records[0] = Record {
            site: ev.site,
            flags: flags | set.map_or(0, |s| (*s).flags),
            time,
            value: ev.value,
            aux: ev.aux,
        };
        // The records an inline USDT stub reserves after the first: arguments 2k+3
        // and 2k+4, zeros where the probe has fewer.
        for j in 1..N {
            (*p).records[j] = Record {
                site: ev.site,
                flags: flags | FLAG_USDT_MORE | ((j as u32 - 1) << FLAG_USDT_INDEX_SHIFT),
                time,
                value: 0,
                aux: 0,
            };
        }
        if let Some(s) = set {
            fill::<N>(ctx, s, &raw mut (*p).records, ev.tp);
        }
    }
    entry.submit(0);
    stat_add(STAT_RECORDS_DELIVERED, nrec as u64);
    stat_add(STAT_CHUNKS, 1);
}

/// Evaluate the operands of `set` into `recs`: operand k → value (k even) or aux (k
/// odd) of record k / 2. Its own function, so that the register file (up to 264
/// bytes) is on the stack only while it runs, not under the drain's frames.
#[inline(never)]
fn fill<const N: usize>(
    ctx: &ProbeContext,
    set: *const OperandSet,
    recs: *mut [Record; N],
    tp: u64,
) {
    let mut regs = [0u64; NREGS];
    arch::registers(ctx, &mut regs);
    // SAFETY: a live OPERANDS value.
    let n = usize::from(unsafe { (*set).count });
    // A constant bound, so that the verifier sees every store inside the reservation.
    let bound = if 2 * N < MAX_OPERANDS {
        2 * N
    } else {
        MAX_OPERANDS
    };
    for k in 0..bound {
        if k >= n {
            break;
        }
        // SAFETY: k < MAX_OPERANDS; k / 2 < N.
        unsafe {
            let v = eval(&regs, &(*set).ops[k], tp);
            let r = recs.cast::<Record>().add(k / 2);
            if k % 2 == 0 {
                (*r).value = v;
            } else {
                (*r).aux = v;
            }
        }
    }
}

/// The value an operand describes, from the register file `regs` (descriptor
/// numbering) and the thread's memory. A load that fails gives 0 and counts a read
/// error.
#[inline(never)]
fn eval(regs: &[u64; NREGS], op: &Operand, tp: u64) -> u64 {
    // A register number from the map is checked against the file (REG_NONE → 0).
    let reg = |r: u8| regs.get(usize::from(r)).copied().unwrap_or(0);
    match op.kind {
        OP_IMM => op.disp as u64,
        OP_REG if op.flags & OPF_HIGH8 != 0 => {
            let v = reg(op.base) >> 8;
            if op.flags & OPF_SIGNED != 0 {
                v as i8 as i64 as u64
            } else {
                v as u8 as u64
            }
        }
        OP_REG => op.extend(reg(op.base)),
        OP_ADDR | OP_LOAD => {
            let mut base = reg(op.base);
            if op.flags & OPF_STRIP_PAC != 0 {
                base &= !PAC_BITS;
            }
            let mut ea = base
                .wrapping_add(op.scaled_index(reg(op.index)))
                .wrapping_add(op.disp as u64);
            if op.flags & OPF_TP != 0 {
                ea = ea.wrapping_add(tp);
            }
            if op.kind == OP_ADDR {
                return ea;
            }
            let v = match op.size {
                1 => read_user::<u8>(ea).map(u64::from),
                2 => read_user::<u16>(ea).map(u64::from),
                4 => read_user::<u32>(ea).map(u64::from),
                _ => read_user::<u64>(ea),
            };
            match v {
                Ok(v) => op.extend(v),
                Err(_) => {
                    stat_add(STAT_READ_ERRORS, 1);
                    0
                }
            }
        }
        _ => 0,
    }
}
