//! What the hooks keep per thread (the guard's depth, the cached kernel thread id, ...), in
//! thread-local blocks reached through TLS descriptors.
//!
//! Why not `thread_local!`: in a shared library, Rust reaches a thread-local through
//! `__tls_get_addr` (the general-dynamic model; stable Rust cannot choose another), a call of
//! about fourteen instructions that may clobber every caller-saved register, so a hook that
//! only checks its depth (a driver call made from inside a runtime call we already record)
//! must build a whole frame around it first. A TLS descriptor (`-mtls-dialect=gnu2`, which C
//! code gets from a flag) is resolved by the loader once: for a library loaded at start
//! (`LD_PRELOAD`) its function returns the block's offset from the thread pointer in two
//! instructions and clobbers nothing but `rax`; for a library opened later (`dlopen`, the
//! Python API without `oomtrace run`) it takes the dynamic path, which allocates the block on
//! a thread's first use as `__tls_get_addr` does. Either way the module needs no static TLS
//! (no `DF_STATIC_TLS`), so a late `dlopen` cannot fail for want of it.
//!
//! Each block (`thread_block!`) is a hidden symbol in `.tbss`: zero in every new thread, a fork
//! child keeps its thread's copy, nothing runs when the thread ends. Blocks: the hooks' own
//! ([`get`]: the guard's depth, the thread id, and PyTorch's allocator methods running on the
//! thread, `torch_reserve.rs`'s), the thread's stack tables (`stack/`).

/// A type a thread block may hold: valid when every byte is zero (a new thread's block is),
/// and without drop glue (nothing runs when the thread ends).
///
/// # Safety
/// All-zero bytes must be a valid value of the type.
pub unsafe trait Zeroed: Sized {}

/// Declares `fn $name() -> *mut $ty`: this thread's block of `$ty`, zero when the thread
/// starts, reached through a TLS descriptor (see the module doc). The block's symbol is
/// `oomtrace_tls_$name`, hidden: two blocks of one name do not link.
macro_rules! thread_block {
    ($(#[$meta:meta])* $vis:vis fn $name:ident() -> $ty:ty;) => {
        // The block: zero-initialized thread-local storage of the type's size.
        core::arch::global_asm!(
            ".pushsection .tbss,\"awT\",@nobits",
            ".p2align 4",
            concat!(".globl oomtrace_tls_", stringify!($name)),
            concat!(".hidden oomtrace_tls_", stringify!($name)),
            concat!(".type oomtrace_tls_", stringify!($name), ",@object"),
            concat!(".size oomtrace_tls_", stringify!($name), ", {size}"),
            concat!("oomtrace_tls_", stringify!($name), ":"),
            ".zero {size}",
            ".popsection",
            size = const core::mem::size_of::<$ty>(),
        );
        $(#[$meta])*
        ///
        /// The pointer is valid for the thread's whole life, its thread-local destructors
        /// included, and only on this thread.
        #[inline(always)]
        $vis fn $name() -> *mut $ty {
            const _: () = assert!(
                !core::mem::needs_drop::<$ty>(),
                "a thread block runs no destructor"
            );
            const _: () = assert!(core::mem::align_of::<$ty>() <= 16);
            fn zeroed<T: $crate::this_thread::Zeroed>() {}
            let _ = zeroed::<$ty>;
            let offset: usize;
            // SAFETY: the TLS descriptor sequence of the x86-64 psABI for the block above:
            // the descriptor's function, called with `rax` pointing at the descriptor,
            // returns the block's offset from the thread pointer (`fs:0`) and preserves every
            // register but `rax` and the flags. Older glibc's dynamic path (a library opened
            // by `dlopen`, a thread's first use) calls malloc and may clobber vector registers
            // (glibc bug 31372): they are declared clobbered. Not `nostack`: the call pushes a
            // return address, so the compiler keeps no red zone here and aligns the stack as
            // for a call. Pure and `nomem`: the answer is the same for the thread's whole life
            // and depends on no memory the program writes (the descriptor is the loader's),
            // so the compiler asks once per function even across calls.
            unsafe {
                core::arch::asm!(
                    concat!("lea rax, [rip + oomtrace_tls_", stringify!($name), "@TLSDESC]"),
                    concat!("call qword ptr [rax + oomtrace_tls_", stringify!($name), "@TLSCALL]"),
                    "add rax, qword ptr fs:[0]",
                    out("rax") offset,
                    out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                    out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                    out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                    out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
                    options(pure, nomem),
                );
            }
            offset as *mut $ty
        }
    };
}
pub(crate) use thread_block;

/// The hooks' own per-thread state.
#[repr(C)]
pub struct HookThread {
    /// >0 while this thread is inside a recording hook (see `guard::enter`).
    pub depth: u32,
    /// The kernel thread id, 0 until first asked (see [`tid`]).
    pub tid: u32,
    /// `torch_reserve.rs`'s: this thread's place in PyTorch's allocator methods. In this
    /// block, not one of its own: the wrapper of each method enters it and then the guard,
    /// and one block is one lookup (5 instructions a tensor less).
    pub torch_method: TorchMethod,
}

/// This thread's place in PyTorch's allocator methods (read and written by
/// `torch_reserve.rs` alone).
#[repr(C)]
pub struct TorchMethod {
    /// >0 while this thread runs one of the allocator's methods.
    pub depth: u32,
    /// The last failed device allocation of the outermost method running on this thread:
    /// its error (0: none), size and device.
    pub failed_rc: i32,
    pub failed_size: u64,
    pub failed_device: i16,
    /// What PyTorch's out-of-memory observer said the allocator was allowed to reserve, in the
    /// method running on this thread (0: it did not speak).
    pub observed: u64,
}

// SAFETY: integers only; zero is a valid value of each (and means "none" where it matters).
unsafe impl Zeroed for HookThread {}

thread_block! {
    /// This thread's hook state.
    pub fn get() -> HookThread;
}

/// The kernel thread id, asked once per thread and kept in its block.
#[inline]
pub fn tid() -> u32 {
    let t = get();
    // SAFETY: this thread's own block, read and written on this thread only.
    unsafe {
        if (*t).tid == 0 {
            // SAFETY: gettid has no preconditions.
            (*t).tid = libc::gettid() as u32;
        }
        (*t).tid
    }
}

/// The kernel thread id if this thread asked it already ([`tid`]), else 0: no call.
#[inline(always)]
pub fn known_tid() -> u32 {
    // SAFETY: this thread's own block, read on this thread only.
    unsafe { (*get()).tid }
}

/// In a fork child: its thread has a new id.
pub fn forget_tid() {
    // SAFETY: as in `tid`.
    unsafe { (*get()).tid = 0 };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each thread has its own block, zero when it starts, at one address for its life.
    #[test]
    fn each_thread_has_its_own_zeroed_block() {
        let here = get();
        // SAFETY: this thread's block, used on this thread only.
        unsafe { (*here).tid = 7 };
        let there = std::thread::spawn(|| {
            let b = get();
            // SAFETY: as above, on the spawned thread.
            let seen = unsafe { ((*b).depth, (*b).tid) };
            (b as usize, seen)
        })
        .join()
        .unwrap();
        assert_ne!(there.0, here as usize);
        assert_eq!(there.1, (0, 0));
        assert_eq!(get(), here);
        // SAFETY: as above.
        assert_eq!(unsafe { (*here).tid }, 7);
        // SAFETY: as above.
        unsafe { (*here).tid = 0 };
    }
}
