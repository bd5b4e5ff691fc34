//! What a traced program hands the user-space drain: any drain-socket message is
//! read as its header says or counted bad, and any slot read from its memory gives a
//! span inside the slot's own buffer, no larger than a rewriter makes one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_common::{MAX_BUF_RECORDS, RECORD_SIZE, SLOT_SIZE, Slot};
use tracer_user::record::drain::target_data::{Message, SlotSpan, parse_message, slot_span};

fuzz_target!(|data: &[u8]| {
    if let Message::Records(h, records) = parse_message(data) {
        assert_eq!(records.len(), h.count as usize * RECORD_SIZE);
    }
    let n = SLOT_SIZE as usize;
    let Some(raw) = data.get(..n + 5) else {
        return;
    };
    // SAFETY: Slot is repr(C) plain data of exactly SLOT_SIZE bytes; any bits are valid.
    let slot: Slot = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
    let tid = u32::from_le_bytes(raw[n..n + 4].try_into().unwrap());
    let ring = raw[n + 4] & 1 == 1;
    if let SlotSpan::Collect { bytes, rotate } = slot_span(&slot, tid, ring) {
        let max = u64::from(MAX_BUF_RECORDS) * RECORD_SIZE as u64 + 4096;
        assert!(bytes <= max && bytes % RECORD_SIZE as u64 == 0);
        assert!(rotate <= bytes && rotate % RECORD_SIZE as u64 == 0);
        assert!(slot.start.checked_add(bytes).is_some() || bytes == 0);
    }
});
