//! Where two CPython functions each capture would call read their answer, found in their
//! own machine code, so that the capture reads it there instead of calling them.
//!
//! - `_Py_IsFinalizing` (3.9 to 3.12) and `Py_IsFinalizing` (3.13+) load one pointer-sized
//!   word, `_PyRuntime._finalizing`, and return whether it is non-zero ([`word_tested`]):
//!   a load and a test instead of a call (5 instructions a capture, not 12).
//! - `PyGILState_GetThisThreadState` returns `pthread_getspecific` of the key in
//!   `_PyRuntime`'s `autoTSSkey` when the runtime's `autoInterpreterState` is set
//!   ([`key_read`]): `pthread_getspecific` of that key directly, while the key's own
//!   `Py_tss_t` says it is created (cleared with `autoInterpreterState` at exit): its two
//!   calls fewer.
//!
//! A word is used only when the function's body is exactly one of the shapes below and the
//! word lies in the first 64 KiB of `_PyRuntime`; any other body (another compiler, a debug
//! build, another architecture, a version that reads elsewhere) keeps the call. The body is
//! the authority, not a table of offsets per version: what it reads is what CPython itself
//! answers from. The key is checked once more where it is found (`mod.rs`).
//!
//! `_Py_IsFinalizing` (x86-64, after an optional `endbr64`), each followed by `setne al`, an
//! optional `movzx eax, al`, and `ret`:
//!
//! | shape | the word |
//! |---|---|
//! | `mov rax, [rip+d32]`; `mov rax, [rax+d8]`; `test rax, rax` | `*(GOT slot) + d8` (libpython built with `-fPIC`) |
//! | `mov rax, [rip+d32]`; `test rax, rax` | `rip + d32` (a static or `-fno-semantic-interposition` build) |
//! | `mov rax, [rip+d32]`; `cmp qword [rax+d8], 0` | `*(GOT slot) + d8` |
//! | `cmp qword [rip+d32], 0` | `rip + d32` |
//!
//! `PyGILState_GetThisThreadState`: a test of `autoInterpreterState` against 0 (`cmp qword
//! [rip+d32], 0`, or `mov rax, [rip+d32]` of the GOT slot then `cmp qword [rax+d], 0`), a `je`
//! (rel8 or rel32), the key's argument (`lea rdi, [..]` of the `Py_tss_t` for
//! `PyThread_tss_get`, whose key is 4 bytes in; or `mov edi, [..]` of the key itself, where
//! the build inlined it, as Debian's does), and a tail `jmp` (to `PyThread_tss_get` or
//! `pthread_getspecific`).

/// Bytes of a function read: the longest shape is 29.
pub const BODY_BYTES: usize = 32;
/// How far into `_PyRuntime` a word may lie.
pub const RUNTIME_BYTES: u64 = 64 * 1024;

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// `mov rax, [rip+d32]`
const MOV_RAX_RIP: [u8; 3] = [0x48, 0x8b, 0x05];
/// `mov rax, [rax+d8]`
const MOV_RAX_RAX_D8: [u8; 3] = [0x48, 0x8b, 0x40];
/// `test rax, rax`
const TEST_RAX: [u8; 3] = [0x48, 0x85, 0xc0];
/// `cmp qword [rax+d8], imm8` (the immediate must be 0)
const CMP_RAX_D8: [u8; 3] = [0x48, 0x83, 0x78];
/// `cmp qword [rip+d32], imm8` (the immediate must be 0)
const CMP_RIP: [u8; 3] = [0x48, 0x83, 0x3d];
/// `setne al`
const SETNE_AL: [u8; 3] = [0x0f, 0x95, 0xc0];
/// `movzx eax, al`
const MOVZX_EAX_AL: [u8; 3] = [0x0f, 0xb6, 0xc0];
const RET: u8 = 0xc3;
/// `cmp qword [rax+d32], imm8`
const CMP_RAX_D32: [u8; 3] = [0x48, 0x83, 0xb8];
/// `je rel8`, `je rel32`
const JE_REL8: u8 = 0x74;
const JE_REL32: [u8; 2] = [0x0f, 0x84];
/// `lea rdi, [rip+d32]`, `lea rdi, [rax+d32]`, `lea rdi, [rax+d8]`
const LEA_RDI_RIP: [u8; 3] = [0x48, 0x8d, 0x3d];
const LEA_RDI_RAX_D32: [u8; 3] = [0x48, 0x8d, 0xb8];
const LEA_RDI_RAX_D8: [u8; 3] = [0x48, 0x8d, 0x78];
/// `mov edi, [rip+d32]`, `mov edi, [rax+d32]`, `mov edi, [rax+d8]`
const MOV_EDI_RIP: [u8; 2] = [0x8b, 0x3d];
const MOV_EDI_RAX_D32: [u8; 2] = [0x8b, 0xb8];
const MOV_EDI_RAX_D8: [u8; 2] = [0x8b, 0x78];
/// `jmp rel32`
const JMP_REL32: u8 = 0xe9;

/// The address of the word that the function at `at`, whose first bytes are `body`, loads
/// and tests, if its body is one of the shapes above. `got` reads a GOT slot (None: not
/// readable); `runtime` is `_PyRuntime`'s address, and the word must lie in its first
/// `RUNTIME_BYTES`.
pub fn word_tested(
    body: &[u8; BODY_BYTES],
    at: u64,
    runtime: u64,
    got: impl Fn(u64) -> Option<u64>,
) -> Option<u64> {
    let mut code = Code::start(body);
    let word = if code.eat(&MOV_RAX_RIP) {
        let slot = code.rip_relative(at)?;
        if code.eat(&MOV_RAX_RAX_D8) {
            let d8 = code.byte()?;
            code.eat(&TEST_RAX).then_some(())?;
            got(slot)?.checked_add(u64::from(d8))?
        } else if code.eat(&CMP_RAX_D8) {
            let d8 = code.byte()?;
            (code.byte()? == 0).then_some(())?;
            got(slot)?.checked_add(u64::from(d8))?
        } else {
            code.eat(&TEST_RAX).then_some(())?;
            slot
        }
    } else if code.eat(&CMP_RIP) {
        // The displacement counts from the end of the instruction, after its immediate.
        let d32 = code.i32()?;
        (code.byte()? == 0).then_some(())?;
        (at + code.pos as u64).checked_add_signed(i64::from(d32))?
    } else {
        return None;
    };
    code.eat(&SETNE_AL).then_some(())?;
    code.eat(&MOVZX_EAX_AL);
    (code.byte()? == RET).then_some(())?;
    in_runtime(word, runtime, 8)
}

/// The address of the key (`pthread_key_t`, 4 bytes) that the function at `at`, whose first
/// bytes are `body`, passes on in its tail call, if its body is the shape of
/// `PyGILState_GetThisThreadState` above. `got` and `runtime` as for [`word_tested`].
pub fn key_read(
    body: &[u8; BODY_BYTES],
    at: u64,
    runtime: u64,
    got: impl Fn(u64) -> Option<u64>,
) -> Option<u64> {
    let mut code = Code::start(body);
    // The test of `autoInterpreterState`: through the GOT (`base` is then its slot's value,
    // `_PyRuntime`), or direct.
    let base = if code.eat(&MOV_RAX_RIP) {
        let slot = code.rip_relative(at)?;
        if code.eat(&CMP_RAX_D32) {
            code.i32()?;
        } else if code.eat(&CMP_RAX_D8) {
            code.byte()?;
        } else {
            return None;
        }
        (code.byte()? == 0).then_some(())?;
        Some(got(slot)?)
    } else if code.eat(&CMP_RIP) {
        code.i32()?;
        (code.byte()? == 0).then_some(())?;
        None
    } else {
        return None;
    };
    if code.eat(&[JE_REL8]) {
        code.byte()?;
    } else if code.eat(&JE_REL32) {
        code.i32()?;
    } else {
        return None;
    }
    // The argument: the `Py_tss_t` (its key 4 bytes in) or the key itself.
    let (address, key_offset) = match base {
        Some(base) if code.eat(&LEA_RDI_RAX_D32) => {
            (base.checked_add_signed(code.i32()?.into())?, 4)
        }
        Some(base) if code.eat(&LEA_RDI_RAX_D8) => {
            (base.checked_add_signed((code.byte()? as i8).into())?, 4)
        }
        Some(base) if code.eat(&MOV_EDI_RAX_D32) => {
            (base.checked_add_signed(code.i32()?.into())?, 0)
        }
        Some(base) if code.eat(&MOV_EDI_RAX_D8) => {
            (base.checked_add_signed((code.byte()? as i8).into())?, 0)
        }
        None if code.eat(&LEA_RDI_RIP) => (code.rip_relative(at)?, 4),
        None if code.eat(&MOV_EDI_RIP) => (code.rip_relative(at)?, 0),
        _ => return None,
    };
    (code.byte()? == JMP_REL32).then_some(())?;
    code.i32()?;
    in_runtime(address.checked_add(key_offset)?, runtime, 4)
}

/// `word` if it lies in the first `RUNTIME_BYTES` of `_PyRuntime`, aligned to `align`.
fn in_runtime(word: u64, runtime: u64, align: u64) -> Option<u64> {
    let inside = word >= runtime && word < runtime.saturating_add(RUNTIME_BYTES);
    (inside && word.is_multiple_of(align)).then_some(word)
}

/// A cursor over the body.
struct Code<'a> {
    body: &'a [u8; BODY_BYTES],
    pos: usize,
}

impl Code<'_> {
    /// At the function's first instruction that does something (past an `endbr64`).
    fn start(body: &[u8; BODY_BYTES]) -> Code<'_> {
        let mut code = Code { body, pos: 0 };
        code.eat(&ENDBR64);
        code
    }

    /// Steps over `bytes` if they come next.
    fn eat(&mut self, bytes: &[u8]) -> bool {
        let next = self.body.get(self.pos..self.pos + bytes.len());
        let here = next == Some(bytes);
        if here {
            self.pos += bytes.len();
        }
        here
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.body.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn i32(&mut self) -> Option<i32> {
        let b = self.body.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        Some(i32::from_le_bytes(b.try_into().ok()?))
    }

    /// The address a `[rip+d32]` operand that ends here names.
    fn rip_relative(&mut self, at: u64) -> Option<u64> {
        let d32 = self.i32()?;
        (at + self.pos as u64).checked_add_signed(i64::from(d32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: u64 = 0x29_1ae0;
    const RUNTIME: u64 = 0x44_0000;

    fn body(bytes: &[u8]) -> [u8; BODY_BYTES] {
        let mut b = [0xccu8; BODY_BYTES];
        b[..bytes.len()].copy_from_slice(bytes);
        b
    }

    /// The GOT: one slot, holding `_PyRuntime`'s address.
    fn got(slot: u64) -> impl Fn(u64) -> Option<u64> {
        move |at| (at == slot).then_some(RUNTIME)
    }

    /// Python 3.11.7 built by pyenv (`-fPIC`): the word through the GOT, at offset 0x18.
    #[test]
    fn reads_the_word_through_the_got_as_pyenv_builds_it() {
        let code = body(&[
            0x48, 0x8b, 0x05, 0x49, 0x22, 0x1b, 0x00, // mov rax, [rip+0x1b2249]
            0x48, 0x8b, 0x40, 0x18, // mov rax, [rax+0x18]
            0x48, 0x85, 0xc0, // test rax, rax
            0x0f, 0x95, 0xc0, // setne al
            0x0f, 0xb6, 0xc0, // movzx eax, al
            0xc3,
        ]);
        let slot = AT + 7 + 0x1b_2249;
        assert_eq!(
            word_tested(&code, AT, RUNTIME, got(slot)),
            Some(RUNTIME + 0x18)
        );
        // The same body whose GOT slot cannot be read, or holds something else.
        assert_eq!(word_tested(&code, AT, RUNTIME, |_| None), None);
        assert_eq!(word_tested(&code, AT, RUNTIME, |_| Some(0x1000)), None);
    }

    /// A build that reaches `_PyRuntime` directly, with CET's `endbr64` first, and one that
    /// compares in memory.
    #[test]
    fn reads_the_word_of_direct_and_compare_shapes() {
        // `rip + d32` after the 7-byte load (and 4 of endbr64) must be RUNTIME + 0x18.
        let d = (RUNTIME + 0x18 - (AT + 4 + 7)) as i64 as i32;
        let mut bytes = vec![0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x05];
        bytes.extend(d.to_le_bytes());
        bytes.extend([0x48, 0x85, 0xc0, 0x0f, 0x95, 0xc0, 0xc3]);
        assert_eq!(
            word_tested(&body(&bytes), AT, RUNTIME, |_| None),
            Some(RUNTIME + 0x18)
        );
        // cmp qword [rip+d32], 0 (8 bytes); setne al; movzx eax, al; ret
        let d = (RUNTIME + 0x28 - (AT + 8)) as i64 as i32;
        let mut bytes = vec![0x48, 0x83, 0x3d];
        bytes.extend(d.to_le_bytes());
        bytes.extend([0x00, 0x0f, 0x95, 0xc0, 0x0f, 0xb6, 0xc0, 0xc3]);
        assert_eq!(
            word_tested(&body(&bytes), AT, RUNTIME, |_| None),
            Some(RUNTIME + 0x28)
        );
        // mov rax, [rip+d32] (the GOT); cmp qword [rax+0x18], 0; setne al; ret
        let mut bytes = vec![0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00];
        bytes.extend([0x48, 0x83, 0x78, 0x18, 0x00, 0x0f, 0x95, 0xc0, 0xc3]);
        assert_eq!(
            word_tested(&body(&bytes), AT, RUNTIME, got(AT + 7 + 0x10)),
            Some(RUNTIME + 0x18)
        );
    }

    /// Anything else keeps the call: another body, another test, a compare with something
    /// else than 0, no `ret` where it ends, a word outside `_PyRuntime`'s first 64 KiB.
    #[test]
    fn any_other_body_is_refused() {
        let good = [
            0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x40, 0x18, 0x48, 0x85, 0xc0,
            0x0f, 0x95, 0xc0, 0x0f, 0xb6, 0xc0, 0xc3,
        ];
        let slot = AT + 7 + 0x10;
        assert!(word_tested(&body(&good), AT, RUNTIME, got(slot)).is_some());
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut push_rbp = vec![0x55];
        push_rbp.extend(good);
        cases.push(("a frame set up first (a debug build)", push_rbp));
        let mut sete = good.to_vec();
        sete[15] = 0x94;
        cases.push(("sete: the opposite answer", sete));
        let mut no_ret = good.to_vec();
        no_ret[20] = 0x90;
        cases.push(("no ret where the body should end", no_ret));
        let mut no_test = good.to_vec();
        no_test.drain(11..14);
        cases.push(("no test of the word loaded", no_test));
        let mut other_reg = good.to_vec();
        other_reg[2] = 0x0d; // mov rcx, [rip+d32]
        cases.push(("another register", other_reg));
        for (what, bytes) in cases {
            assert_eq!(
                word_tested(&body(&bytes), AT, RUNTIME, got(slot)),
                None,
                "{what}"
            );
        }
        // The word past the first 64 KiB of `_PyRuntime`, or before it.
        let far_got = move |at: u64| (at == slot).then_some(RUNTIME + RUNTIME_BYTES);
        assert_eq!(word_tested(&body(&good), AT, RUNTIME, far_got), None);
        let before = move |at: u64| (at == slot).then_some(RUNTIME - 0x100);
        assert_eq!(word_tested(&body(&good), AT, RUNTIME, before), None);
    }

    /// `PyGILState_GetThisThreadState` of pyenv's 3.11.7 (`-fPIC`, through the GOT, the
    /// `Py_tss_t` passed to `PyThread_tss_get`): the key 4 bytes into it, at 0x254.
    #[test]
    fn finds_the_key_pyenvs_build_passes_on() {
        let code = body(&[
            0x48, 0x8b, 0x05, 0x09, 0xd8, 0x1a, 0x00, // mov rax, [rip+0x1ad809]
            0x48, 0x83, 0xb8, 0x48, 0x02, 0x00, 0x00, 0x00, // cmp qword [rax+0x248], 0
            0x74, 0x0f, // je
            0x48, 0x8d, 0xb8, 0x50, 0x02, 0x00, 0x00, // lea rdi, [rax+0x250]
            0xe9, 0xf3, 0x3b, 0xe6, 0xff, // jmp PyThread_tss_get@plt
        ]);
        let slot = AT + 7 + 0x1a_d809;
        assert_eq!(
            key_read(&code, AT, RUNTIME, got(slot)),
            Some(RUNTIME + 0x254)
        );
        assert_eq!(key_read(&code, AT, RUNTIME, |_| None), None);
    }

    /// Debian's 3.11.2 (direct, `PyThread_tss_get` inlined: the key itself to
    /// `pthread_getspecific`), and anything else refused.
    #[test]
    fn finds_the_key_debians_build_reads_and_refuses_other_bodies() {
        // cmp qword [rip+d], 0 (8 bytes); je rel32 (6); mov edi, [rip+d] (6); jmp rel32
        let test = (RUNTIME + 0x248 - (AT + 8)) as i64 as i32;
        let key = (RUNTIME + 0x254 - (AT + 8 + 6 + 6)) as i64 as i32;
        let mut bytes = vec![0x48, 0x83, 0x3d];
        bytes.extend(test.to_le_bytes());
        bytes.extend([0x00, 0x0f, 0x84, 0x1f, 0xc8, 0xf2, 0xff, 0x8b, 0x3d]);
        bytes.extend(key.to_le_bytes());
        bytes.extend([0xe9, 0xa7, 0x8a, 0xf2, 0xff]);
        assert_eq!(
            key_read(&body(&bytes), AT, RUNTIME, |_| None),
            Some(RUNTIME + 0x254)
        );
        let mut no_jmp = bytes.clone();
        no_jmp[20] = 0xe8; // a call, not the tail jump
        assert_eq!(key_read(&body(&no_jmp), AT, RUNTIME, |_| None), None);
        let mut no_test = bytes.clone();
        no_test[7] = 0x01; // compared with 1, not 0
        assert_eq!(key_read(&body(&no_test), AT, RUNTIME, |_| None), None);
        // The finalizing check's body is not this one.
        let finalizing = [
            0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x40, 0x18, 0x48, 0x85, 0xc0,
            0x0f, 0x95, 0xc0, 0xc3,
        ];
        assert_eq!(
            key_read(&body(&finalizing), AT, RUNTIME, got(AT + 7 + 0x10)),
            None
        );
    }
}
