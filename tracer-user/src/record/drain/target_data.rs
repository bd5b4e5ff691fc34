//! What a traced program hands the user-space drain (and the stop drain), checked before
//! it is believed: the messages it sends on the drain socket and the slots read from its
//! memory; records read from it as trace chunks. Both are
//! written by the program (possibly a broken or hostile one); nothing here trusts a
//! length, an address or an owner it has not checked.

use tracer_common::{
    CHUNK_HEADER_BYTES, CHUNK_KIND_RECORDS, CHUNK_KIND_SLOT, CHUNK_RECORDS, ChunkHeader,
    MAX_BUF_RECORDS, RECORD_SIZE, Slot,
};

use crate::tracefile::chunk_header;

/// One message of the drain socket.
#[derive(Debug)]
pub enum Message<'a> {
    /// A thread claimed the slot at this address.
    Slot(ChunkHeader, u64),
    /// A full buffer: exactly `header.count` records.
    Records(ChunkHeader, &'a [u8]),
    /// Anything else (counted as bad, skipped).
    Bad,
}

/// What `msg` is; its length must be exactly what its header says.
pub fn parse_message(msg: &[u8]) -> Message<'_> {
    let Some(h) = chunk_header(msg) else {
        return Message::Bad;
    };
    let body = &msg[CHUNK_HEADER_BYTES..];
    match h.kind {
        CHUNK_KIND_SLOT if body.len() >= 16 => {
            let mut addr = [0u8; 8];
            addr.copy_from_slice(&body[..8]);
            Message::Slot(h, u64::from_le_bytes(addr))
        }
        CHUNK_KIND_RECORDS if (h.count as usize).checked_mul(RECORD_SIZE) == Some(body.len()) => {
            Message::Records(h, body)
        }
        _ => Message::Bad,
    }
}

/// Why a message of the drain socket was not believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No `SCM_CREDENTIALS` came with it.
    NoCredentials,
    /// Its header names a process other than the one that sent it (the kernel's word).
    NotTheSender,
    /// Its sender is no process the tracer holds seized, or (a slot) its thread is no
    /// thread the tracer holds seized in it.
    NotSeized,
}

/// Whether a message with header `h` is believed: sent by process `sender` (from
/// `SCM_CREDENTIALS`: the kernel's, not the program's word), naming that process,
/// which the tracer holds seized (`sender_held`). The header's tid of a records message
/// is a label only (a forked child flushes a buffer it inherited, owned by its
/// parent's thread): nothing is read or written because of it.
pub fn check_sender(
    h: &ChunkHeader,
    sender: Option<u32>,
    sender_held: bool,
) -> Result<(), Refused> {
    let sender = sender.ok_or(Refused::NoCredentials)?;
    if h.pid != sender {
        return Err(Refused::NotTheSender);
    }
    if !sender_held {
        return Err(Refused::NotSeized);
    }
    Ok(())
}

/// Whether a slot message's thread is one the tracer holds seized in the process the
/// header names (`seized_tgid`: the process of thread `h.tid`, if it is held): its
/// slots are read and released at that thread's exit. A thread claims its slot itself.
pub fn check_slot_owner(h: &ChunkHeader, seized_tgid: Option<u32>) -> Result<(), Refused> {
    if seized_tgid != Some(h.pid) {
        return Err(Refused::NotSeized);
    }
    Ok(())
}

/// What to collect from a slot read out of thread `tid`'s process.
#[derive(Debug, PartialEq, Eq)]
pub enum SlotSpan {
    /// Another thread owns it now (or it was released): leave it.
    NotOwned,
    /// Its cursor and bounds contradict each other: count it bad, leave it.
    Bad,
    /// `bytes` from `slot.start`, to be rotated left by `rotate` bytes (a circular
    /// buffer is collected whole, oldest record first).
    Collect { bytes: u64, rotate: u64 },
}

/// The records `slot` holds for `tid`; `ring` when its buffer is circular. A trace
/// buffer's cursor may run past its end by one stub's reservation (at most a page);
/// no buffer is larger than a rewriter makes them.
pub fn slot_span(slot: &Slot, tid: u32, ring: bool) -> SlotSpan {
    slot_span_within(
        slot,
        tid,
        ring,
        u64::from(MAX_BUF_RECORDS) * RECORD_SIZE as u64,
    )
}

/// [`slot_span`] of a slot whose binary's buffers hold `max_bytes` (its metadata's
/// geometry): a slot claiming a larger buffer is bad.
pub fn slot_span_within(slot: &Slot, tid: u32, ring: bool, max_bytes: u64) -> SlotSpan {
    if slot.owner_tid != tid || slot.cur < slot.start {
        return SlotSpan::NotOwned;
    }
    let size = slot.end.saturating_sub(slot.start);
    let used = slot.cur - slot.start;
    let bytes = if ring { size } else { used };
    let aligned = |n: u64| n.is_multiple_of(RECORD_SIZE as u64);
    if !aligned(bytes)
        || !aligned(used)
        || size > max_bytes.min(u64::from(MAX_BUF_RECORDS) * RECORD_SIZE as u64)
        || bytes > size + 4096
        || (ring && slot.cur >= slot.end)
    {
        return SlotSpan::Bad;
    }
    let rotate = if ring { used } else { 0 };
    SlotSpan::Collect { bytes, rotate }
}

/// What [`encode_records`] made.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    pub records: u64,
    pub chunks: u64,
    /// Pieces the trace encoder refused.
    pub bad: u64,
}

/// Raw records read from a target (a multiple of `RECORD_SIZE` bytes) as chunk
/// sections of the trace file under header `h`, appended to `out`.
pub fn encode_records(h: ChunkHeader, records: &[u8], out: &mut Vec<u8>) -> Encoded {
    let mut n = Encoded::default();
    for piece in records.chunks(CHUNK_RECORDS * RECORD_SIZE) {
        let mut hh = h;
        hh.kind = CHUNK_KIND_RECORDS;
        hh.count = (piece.len() / RECORD_SIZE) as u32;
        let mut entry = Vec::with_capacity(CHUNK_HEADER_BYTES + piece.len());
        push_header(&mut entry, &hh);
        entry.extend_from_slice(piece);
        if crate::tracefile::encode_chunk(&entry, out).is_none() {
            n.bad += 1;
            continue;
        }
        n.records += u64::from(hh.count);
        n.chunks += 1;
    }
    n
}

fn push_header(out: &mut Vec<u8>, h: &ChunkHeader) {
    for v in [h.kind, h.count, h.pid, h.tid] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&h.seq.to_le_bytes());
    out.extend_from_slice(&h.binary_id.to_le_bytes());
    out.extend_from_slice(&h.cause.to_le_bytes());
    out.extend_from_slice(&h._pad.to_le_bytes());
    out.extend_from_slice(&h.time.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(start: u64, cur: u64, end: u64) -> Slot {
        Slot {
            start,
            cur,
            end,
            owner_tid: 7,
            ..Slot::default()
        }
    }

    #[test]
    fn a_slot_gives_what_its_cursor_says() {
        let s = slot(0x1000, 0x1000 + 5 * 32, 0x1000 + 16 * 32);
        assert_eq!(
            slot_span(&s, 7, false),
            SlotSpan::Collect {
                bytes: 5 * 32,
                rotate: 0
            }
        );
        assert_eq!(
            slot_span(&s, 7, true),
            SlotSpan::Collect {
                bytes: 16 * 32,
                rotate: 5 * 32
            }
        );
        assert_eq!(slot_span(&s, 8, false), SlotSpan::NotOwned);
    }

    #[test]
    fn a_hostile_slot_is_bad_not_an_allocation() {
        // A terabyte "buffer": before, the drain allocated what the cursor said.
        let huge = slot(0, 1 << 40, 1 << 62);
        assert_eq!(slot_span(&huge, 7, false), SlotSpan::Bad);
        // A circular cursor between records would rotate records apart.
        let torn = slot(0x1000, 0x1000 + 40, 0x1000 + 16 * 32);
        assert_eq!(slot_span(&torn, 7, true), SlotSpan::Bad);
        assert!(matches!(parse_message(&[0u8; 3]), Message::Bad));
        // Within its binary's geometry only: 16 records here.
        let big = slot(0x1000, 0x1000 + 32 * 32, 0x1000 + 32 * 32);
        assert_eq!(slot_span_within(&big, 7, false, 16 * 32), SlotSpan::Bad);
        assert!(matches!(
            slot_span_within(&big, 7, false, 32 * 32),
            SlotSpan::Collect { .. }
        ));
    }

    #[test]
    fn a_message_is_believed_only_from_its_seized_sender() {
        let h = ChunkHeader::new(CHUNK_KIND_SLOT, (10 << 32) | 11, 1, 0, 0);
        assert_eq!(check_sender(&h, Some(10), true), Ok(()));
        assert_eq!(check_sender(&h, None, true), Err(Refused::NoCredentials));
        // Another process's pid in the header (the victim's), sent by 10.
        let forged = ChunkHeader::new(CHUNK_KIND_SLOT, (99 << 32) | 11, 1, 0, 0);
        assert_eq!(
            check_sender(&forged, Some(10), true),
            Err(Refused::NotTheSender)
        );
        assert_eq!(check_sender(&h, Some(10), false), Err(Refused::NotSeized));
        // A slot's thread: held, and in the process named.
        assert_eq!(check_slot_owner(&h, Some(10)), Ok(()));
        assert_eq!(check_slot_owner(&h, None), Err(Refused::NotSeized));
        assert_eq!(check_slot_owner(&h, Some(12)), Err(Refused::NotSeized));
    }
}
