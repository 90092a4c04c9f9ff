//! The real function behind a hook: what a symbol-bound call would have reached without
//! oomtrace, for the whole process (`resolve_slot`) or, for runtime hooks, for one calling
//! module (`resolve_for_caller`: several libcudart copies may be loaded).

use std::ffi::c_void;

use super::{Family, Hook};
use crate::log;
use crate::modules;
use crate::once::OneShot;
use crate::symbols::{is_ours, libcuda_handle, loaded_cudart_symbol, pin_provider, real_dlsym};

/// Cold path of `Hook::real`: find the function a symbol-bound call would have reached.
pub fn resolve_slot(hook: &Hook) -> Option<*const ()> {
    let mut p = real_dlsym(libc::RTLD_NEXT, hook.name);
    if p.is_null() || is_ours(p as usize) {
        p = match hook.family {
            Family::Driver | Family::DriverResolver => {
                let h = libcuda_handle();
                if h.is_null() {
                    std::ptr::null_mut()
                } else {
                    real_dlsym(h, hook.name)
                }
            }
            Family::Runtime | Family::RuntimeResolver => loaded_cudart_symbol(hook.name),
        };
    }
    if p.is_null() || is_ours(p as usize) {
        return None;
    }
    match hook.offer_real(p as usize) {
        0 => None,
        v => Some(v as *const ()),
    }
}

/// Serializes the cold path that fills the per-caller tables.
static CALLER_TABLES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The runtime function a call from return address `caller` would have bound to without us:
/// the caller module's own dependency scope first (an extension's private libcudart), then
/// the global one. Remembered per calling module.
pub fn resolve_for_caller(hook: &Hook, caller: u64) -> Option<*const ()> {
    let _serial = CALLER_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let (mods, _) = modules::enumerate();
    let Some(module) = mods.iter().find(|m| m.contains(caller)) else {
        return hook.real();
    };
    let mut p: *mut c_void = std::ptr::null_mut();
    if let Ok(path) = std::ffi::CString::new(module.path.clone()) {
        // SAFETY: NOLOAD: a handle to the already loaded caller, released right after.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if !h.is_null() {
            p = real_dlsym(h, hook.name);
            // SAFETY: drops only our own reference.
            unsafe { libc::dlclose(h) };
        }
    }
    let real = if p.is_null() || is_ours(p as usize) {
        // The caller sees the global scope (the main program, or a library without its own
        // runtime): what symbol binding would have found after us.
        hook.real()? as usize
    } else {
        // Keep the runtime copy that provides it loaded even if the caller is unloaded, so a
        // remembered pointer can never dangle.
        pin_provider(p);
        p as usize
    };
    hook.remember_caller(module.start, module.end, real);
    Some(real as *const ())
}

static UNRESOLVED_SAID: OneShot = OneShot::new();

pub fn warn_unresolved(hook: &Hook) {
    log::warn_once(
        &UNRESOLVED_SAID,
        &format!(
            "cannot find the real {} (is the CUDA library loaded?); returning an error to the caller",
            hook.name_str()
        ),
    );
}
