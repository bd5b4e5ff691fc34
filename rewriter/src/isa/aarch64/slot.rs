//! What the flush and its armed wait path (`wait.rs`) both do to the slot they hold.

use super::enc::*;
use tracer_common::*;

/// `cur = start` and a new buffer epoch: coarse-timestamp records carry it (see the
/// stub), so a drain position remembered from before the reset is no longer trusted.
/// x9 = slot; clobbers x10.
pub(super) fn reset_buffer(a: &mut Asm) {
    a.put(ldr_x(10, 9, SLOT_START as u32));
    a.put(str_x(10, 9, SLOT_CUR as u32));
    a.put(ldr_w(10, 9, SLOT_GENERATION as u32));
    a.put(add_imm(10, 10, 1, false));
    a.put(str_w(10, 9, SLOT_GENERATION as u32));
}
