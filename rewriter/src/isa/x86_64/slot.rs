//! What the flush and its armed wait path (`wait.rs`) both do to the slot they hold.

use iced_x86::IcedError;
use iced_x86::code_asm::*;
use tracer_common::*;

/// `cur = start` and a new buffer epoch: coarse-timestamp records carry it (see the
/// stub), so a drain position remembered from before the reset is no longer trusted.
/// %rsi = slot; clobbers %rcx.
pub(super) fn reset_buffer(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(rcx, qword_ptr(rsi + SLOT_START as i32))?;
    a.mov(qword_ptr(rsi + SLOT_CUR as i32), rcx)?;
    a.inc(dword_ptr(rsi + SLOT_GENERATION as i32))
}
