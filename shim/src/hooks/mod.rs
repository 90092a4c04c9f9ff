//! Expands the hook table (`table.rs`) into exported wrappers, real-pointer slots and the
//! `HOOKS` list that the resolvers (`resolve.rs`, in this tree because the table lists them
//! and they consult the table) read.
//!
//! Each recorded wrapper: resolve the real function (cold path once), forward untouched unless
//! this is the outermost recording hook, then `before` -> real call (exactly once) -> `after`.

mod real;
pub mod recorders;
pub mod resolve;
mod table;

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use oomtrace_proto::Api;

pub use table::*;

/// How a hooked function is reached, which decides how its real pointer is found and whether
/// the resolvers may hand out its wrapper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Exported by libcuda; substituted in `dlsym` and `cuGetProcAddress` answers.
    Driver,
    /// `cuGetProcAddress[_v2]`: exported by libcuda; substituted in `dlsym` answers.
    DriverResolver,
    /// Exported by libcudart; reached only through symbol binding (see resolve.rs for why
    /// `dlsym` answers are left alone).
    Runtime,
    /// `cudaGetDriverEntryPoint*`; reached through symbol binding.
    RuntimeResolver,
}

/// The name under which `cuGetProcAddress` knows a driver function: a base name, the CUDA
/// version that introduced this exact ABI, and whether it is the per-thread-stream twin.
#[derive(Clone, Copy, Debug)]
pub struct GpaName {
    pub base: &'static str,
    pub since: u32,
    pub ptsz: bool,
}

/// Calling modules remembered per runtime hook. A process has few modules that call the CUDA
/// runtime directly (libc10_cuda, an extension or two); beyond these, the cold path runs.
pub const CALLER_SLOTS: usize = 8;

/// A calling module's address range and the function its own dependency scope resolves.
pub struct CallerSlot {
    start: AtomicU64,
    end: AtomicU64,
    real: AtomicUsize,
}

impl CallerSlot {
    const fn new() -> CallerSlot {
        CallerSlot {
            start: AtomicU64::new(0),
            end: AtomicU64::new(0),
            real: AtomicUsize::new(0),
        }
    }
}

/// One hooked function.
pub struct Hook {
    /// The exact exported symbol.
    pub name: &'static CStr,
    pub api: Api,
    pub family: Family,
    pub gpa: Option<GpaName>,
    /// Address of our exported wrapper.
    pub wrapper: *const (),
    /// The real function, 0 until resolved. Never one of our own wrappers.
    real: AtomicUsize,
    /// Runtime hooks: the real function per calling module (several libcudart copies can be
    /// loaded; each caller must reach the one it would have bound to). Append-only: slots
    /// below `callers_len` are complete and never change.
    callers: [CallerSlot; CALLER_SLOTS],
    callers_len: AtomicUsize,
}

// SAFETY: `wrapper` is the address of a function; it is never written.
unsafe impl Sync for Hook {}

impl Hook {
    pub const fn new(
        name: &'static CStr,
        api: Api,
        family: Family,
        gpa: Option<GpaName>,
        wrapper: *const (),
    ) -> Hook {
        Hook {
            name,
            api,
            family,
            gpa,
            wrapper,
            real: AtomicUsize::new(0),
            callers: [const { CallerSlot::new() }; CALLER_SLOTS],
            callers_len: AtomicUsize::new(0),
        }
    }

    pub fn name_str(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// The real function, resolving it on first use.
    #[inline]
    pub fn real(&self) -> Option<*const ()> {
        let p = self.real.load(Ordering::Acquire);
        if p != 0 {
            return Some(p as *const ());
        }
        // Cold path, and it reaches into the loader: never let a bug there unwind into C.
        crate::guard::catch(|| real::resolve_slot(self)).flatten()
    }

    /// [`Hook::real`] for a wrapper's general path: functions reached by binding or by the
    /// resolvers have one real function, whoever calls.
    pub fn real_bound(&self, _caller: usize) -> Option<*const ()> {
        self.real()
    }

    /// The real function, if it is resolved already (no call: the wrapper's fast path).
    #[inline(always)]
    pub fn known_real_fn(&self) -> Option<*const ()> {
        let p = self.real.load(Ordering::Acquire);
        (p != 0).then_some(p as *const ())
    }

    /// The real function for a call made from return address `caller` when it comes from the
    /// first calling module (most processes have one): one range check, inlined into the
    /// hook's fast path. None: ask [`Hook::real_for`].
    #[inline(always)]
    pub fn first_caller_real(&self, caller: usize) -> Option<*const ()> {
        let first = &self.callers[0];
        let c = caller as u64;
        if self.callers_len.load(Ordering::Acquire) != 0
            && first.start.load(Ordering::Relaxed) <= c
            && c < first.end.load(Ordering::Relaxed)
        {
            return Some(first.real.load(Ordering::Relaxed) as *const ());
        }
        None
    }

    /// The real function for a call made from return address `caller` (runtime hooks),
    /// remembering the calling module on its first call.
    pub fn real_for(&self, caller: usize) -> Option<*const ()> {
        let n = self.callers_len.load(Ordering::Acquire);
        let caller = caller as u64;
        for slot in &self.callers[..n.min(CALLER_SLOTS)] {
            if slot.start.load(Ordering::Relaxed) <= caller
                && caller < slot.end.load(Ordering::Relaxed)
            {
                return Some(slot.real.load(Ordering::Relaxed) as *const ());
            }
        }
        crate::guard::catch(|| real::resolve_for_caller(self, caller)).flatten()
    }

    /// Remembers that calls from [start, end) go to `real` (cold path, serialized by the
    /// caller; full tables simply stop remembering).
    pub fn remember_caller(&self, start: u64, end: u64, real: usize) {
        let n = self.callers_len.load(Ordering::Acquire);
        if n >= CALLER_SLOTS {
            return;
        }
        let slot = &self.callers[n];
        slot.start.store(start, Ordering::Relaxed);
        slot.end.store(end, Ordering::Relaxed);
        slot.real.store(real, Ordering::Relaxed);
        self.callers_len.store(n + 1, Ordering::Release);
    }

    /// The real pointer if one is known, without resolving.
    pub fn known_real(&self) -> usize {
        self.real.load(Ordering::Acquire)
    }

    /// Records `p` as this hook's real function unless one is already known. Returns the
    /// pointer now in the slot. Our own wrappers are refused (a slot holding a wrapper would
    /// call itself forever).
    pub fn offer_real(&self, p: usize) -> usize {
        if p == 0 || crate::symbols::is_ours(p) {
            return self.known_real();
        }
        match self
            .real
            .compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => p,
            Err(existing) => existing,
        }
    }

    /// What a wrapper returns when the real function cannot be found at all (the host would
    /// not have linked without it, so this is only reached in broken installations).
    pub fn unresolved(&self) -> c_int {
        real::warn_unresolved(self);
        crate::cuda::ERROR_SYMBOL_NOT_FOUND
    }
}

pub fn by_name(name: &[u8]) -> Option<&'static Hook> {
    HOOKS.iter().find(|h| h.name.to_bytes() == name)
}

macro_rules! family {
    (Driver) => {
        Family::Driver
    };
    (DriverPtsz) => {
        Family::Driver
    };
    (DriverResolver) => {
        Family::DriverResolver
    };
    (Runtime) => {
        Family::Runtime
    };
    (RuntimeResolver) => {
        Family::RuntimeResolver
    };
}

macro_rules! gpa {
    (Runtime) => {
        None
    };
    (RuntimeResolver) => {
        None
    };
    (DriverPtsz, $base:literal, $since:literal) => {
        Some(GpaName {
            base: $base,
            since: $since,
            ptsz: true,
        })
    };
    ($fam:ident, $base:literal, $since:literal) => {
        Some(GpaName {
            base: $base,
            since: $since,
            ptsz: false,
        })
    };
}

macro_rules! c_name {
    ($name:ident) => {
        // SAFETY: the literal ends with exactly one NUL and has no other.
        unsafe { CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) }
    };
}

/// See table.rs for the syntax.
macro_rules! hook_table {
    (
        recorded {
            $( $name:ident : $fam:ident $( ($base:literal, $since:literal) )?
               ( $( $arg:ident : $ty:ty ),* ) => $rec:ident ( $( $rarg:expr ),* ) ; )*
        }
        custom {
            $( $cname:ident : $cfam:ident $( ($cbase:literal, $csince:literal) )? => $cpath:path ; )*
        }
    ) => {
        /// Dense index of each hooked function in `HOOKS`.
        #[allow(non_camel_case_types)]
        #[repr(usize)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum HookId { $( $name, )* $( $cname, )* }

        /// Every hooked function, in `HookId` order.
        pub static HOOKS: [Hook; [$( stringify!($name), )* $( stringify!($cname), )*].len()] = [
            $( Hook::new(c_name!($name), Api::$name, family!($fam), gpa!($fam $(, $base, $since)?),
                         $name as *const ()), )*
            $( Hook::new(c_name!($cname), Api::Unknown, family!($cfam), gpa!($cfam $(, $cbase, $csince)?),
                         $cpath as *const ()), )*
        ];

        $( wrapper!($fam, $name, ( $( $arg : $ty ),* ), $rec, ( $( $rarg ),* )); )*
    };
}

/// Moves the six integer argument registers up by one and puts the caller's return address
/// first, then tail-jumps: `imp(caller, a0, ..., a4)` returns straight to our caller. Only for
/// functions of at most five integer or pointer arguments (checked where it is used).
macro_rules! caller_first_trampoline {
    ($imp:path) => {
        core::arch::naked_asm!(
            "endbr64",
            "mov r9, r8",
            "mov r8, rcx",
            "mov rcx, rdx",
            "mov rdx, rsi",
            "mov rsi, rdi",
            "mov rdi, [rsp]",
            "jmp {imp}",
            imp = sym $imp,
        )
    };
}

/// The recording path of a wrapper, out of line (`record` inside `$name`'s module): `before`
/// -> the real call (exactly once) -> `after`, then leave the guard that `enter_fast` or
/// `enter` took.
macro_rules! record_fn {
    ($name:ident, ( $( $arg:ident : $ty:ty ),* ), $rec:ident, ( $( $rarg:expr ),* )) => {
        pub(super) type Real = unsafe extern "C" fn( $( $ty ),* ) -> c_int;

        /// Out of line so that the wrapper's checks need no frame of their own: a call that
        /// is not recorded (a driver call made inside a runtime call we record) costs a few
        /// loads and a jump. The caller's arguments come first, in the registers the real
        /// function takes them in, the real function and the guard after them: the wrapper
        /// and this call then move fewer registers (297 instructions a cudaMalloc+cudaFree
        /// pair, events only, against 306 with them first). A five-argument hook gets the
        /// guard on the stack.
        #[inline(never)]
        pub(super) unsafe extern "C" fn record($( $arg : $ty, )* real: Real, held: crate::guard::Held) -> c_int {
            let mut rec = recorders::$rec::new(Api::$name, $( $rarg ),* );
            crate::guard::before(&mut rec, |r| crate::guard::Recorder::before(r));
            // SAFETY: the real function of this symbol, called once with the caller's own
            // arguments (its contract is the caller's), outside `catch`.
            let rc = unsafe { real( $( $arg ),* ) };
            crate::guard::after(&mut rec, rc, |r, rc| crate::guard::Recorder::after(r, rc));
            held.leave();
            rc
        }
    };
}

/// The body every recording wrapper shares, given the real function when it is known
/// without a call (`$fast`: resolved, and for runtime hooks the first calling module) and the
/// way to find it otherwise (`$real`). Known real and recording on: record (outermost hook)
/// or forward untouched (nested), both as tail calls. Anything else (the first call, tracing
/// not started, another calling module) takes the general path: find the real function, start
/// tracing, then forward or record.
macro_rules! call_recorded {
    ($hook:ident, $fast:expr, $caller:expr, $name:ident, ( $( $arg:ident : $ty:ty ),* )) => {{
        if let Some(p) = $fast {
            // SAFETY: `p` was resolved for this exact symbol, whose C signature is this one.
            let real: $name::Real = unsafe { core::mem::transmute::<*const (), $name::Real>(p) };
            match crate::guard::enter_fast() {
                // SAFETY: the real function with the caller's own arguments.
                crate::guard::Entry::Record(held) => return unsafe { $name::record($( $arg, )* real, held) },
                // SAFETY: the real function, called once with the caller's own arguments.
                crate::guard::Entry::Forward => return unsafe { real( $( $arg ),* ) },
                crate::guard::Entry::Unknown => {}
            }
        }
        // The lookup of the real function is left to `general`: a call here, before a tail
        // call, would make every wrapper build a frame to keep the arguments across it.
        $name::general($caller, $( $arg ),* )
    }};
}

/// The general path of a wrapper (`general` inside `$name`'s module), out of line and cold:
/// finds the real function with `$resolve` (given the hook and the caller's return address,
/// which only runtime hooks use), then starts tracing if needed and forwards or records.
macro_rules! general_fn {
    ($name:ident, $resolve:path, ( $( $arg:ident : $ty:ty ),* )) => {
        #[cold]
        #[inline(never)]
        pub(super) fn general(caller: usize, $( $arg : $ty ),* ) -> c_int {
            let hook = &HOOKS[HookId::$name as usize];
            let Some(p) = $resolve(hook, caller) else { return hook.unresolved() };
            // SAFETY: `p` was resolved for this exact symbol, whose C signature is this one.
            let real: Real = unsafe { core::mem::transmute::<*const (), Real>(p) };
            if !crate::guard::enter() {
                // SAFETY: the real function of this symbol, called once with the caller's own
                // arguments (its contract is the caller's).
                return unsafe { real( $( $arg ),* ) };
            }
            // SAFETY: as above.
            unsafe { record($( $arg, )* real, crate::guard::Held::taken()) }
        }
    };
}

/// One exported wrapper. Runtime wrappers are trampolines that pass the caller's address to
/// `<name>::imp`, which picks the real function of the caller's own libcudart.
macro_rules! wrapper {
    (Runtime, $name:ident, ( $( $arg:ident : $ty:ty ),* ), $rec:ident, ( $( $rarg:expr ),* )) => {
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        #[allow(non_snake_case, unused_variables)]
        pub unsafe extern "C" fn $name( $( $arg : $ty ),* ) -> c_int {
            crate::hooks::caller_first_trampoline!($name::imp)
        }

        #[allow(non_snake_case)]
        mod $name {
            use super::*;

            const _: () = assert!(
                [$( stringify!($arg) ),*].len() <= 5,
                "the caller-first trampoline passes at most five arguments in registers"
            );

            pub(super) unsafe extern "C" fn imp(caller: usize, $( $arg : $ty ),* ) -> c_int {
                let hook = &HOOKS[HookId::$name as usize];
                crate::hooks::call_recorded!(hook, hook.first_caller_real(caller), caller, $name, ( $( $arg : $ty ),* ))
            }

            crate::hooks::record_fn!($name, ( $( $arg : $ty ),* ), $rec, ( $( $rarg ),* ));
            crate::hooks::general_fn!($name, Hook::real_for, ( $( $arg : $ty ),* ));
        }
    };
    ($fam:ident, $name:ident, ( $( $arg:ident : $ty:ty ),* ), $rec:ident, ( $( $rarg:expr ),* )) => {
        #[unsafe(no_mangle)]
        #[allow(non_snake_case)]
        pub unsafe extern "C" fn $name( $( $arg : $ty ),* ) -> c_int {
            let hook = &HOOKS[HookId::$name as usize];
            crate::hooks::call_recorded!(hook, hook.known_real_fn(), 0, $name, ( $( $arg : $ty ),* ))
        }

        #[allow(non_snake_case)]
        mod $name {
            use super::*;

            crate::hooks::record_fn!($name, ( $( $arg : $ty ),* ), $rec, ( $( $rarg ),* ));
            crate::hooks::general_fn!($name, Hook::real_bound, ( $( $arg : $ty ),* ));
        }
    };
}

pub(crate) use {
    c_name, call_recorded, caller_first_trampoline, family, general_fn, gpa, hook_table, record_fn,
    wrapper,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// simcuda defines every function we hook, so the integration tests can reach each one.
    #[test]
    fn simcuda_defines_every_hooked_function() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        // The runtime is libcudart.c; the driver is one file per area under src/driver/
        // (driver/core.c is its core).
        let mut sim = std::fs::read_to_string(root.join("simcuda/src/libcudart.c")).unwrap();
        for entry in std::fs::read_dir(root.join("simcuda/src/driver")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "c") {
                sim += &std::fs::read_to_string(path).unwrap();
            }
        }
        for h in HOOKS.iter() {
            let name = h.name_str();
            assert!(
                sim.contains(&format!("{name}(")),
                "simcuda does not define {name}"
            );
        }
    }

    #[test]
    fn names_are_unique_and_match_their_api() {
        for (i, h) in HOOKS.iter().enumerate() {
            assert_eq!(
                HOOKS.iter().position(|o| o.name == h.name),
                Some(i),
                "{} listed twice",
                h.name_str()
            );
            if h.api != Api::Unknown {
                assert_eq!(h.api.name(), h.name_str());
            }
            match h.family {
                Family::Driver | Family::DriverResolver => assert!(h.gpa.is_some()),
                Family::Runtime | Family::RuntimeResolver => assert!(h.gpa.is_none()),
            }
        }
    }

    #[test]
    fn gpa_names_are_unique_per_version_and_stream_mode() {
        for a in HOOKS.iter() {
            for b in HOOKS.iter() {
                if let (Some(x), Some(y)) = (a.gpa, b.gpa) {
                    if a.name != b.name {
                        assert!(
                            !(x.base == y.base && x.since == y.since && x.ptsz == y.ptsz),
                            "{} and {} claim the same cuGetProcAddress name",
                            a.name_str(),
                            b.name_str()
                        );
                    }
                }
            }
        }
    }
}
