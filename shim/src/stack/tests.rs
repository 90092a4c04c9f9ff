//! Unit tests of the stack capture: frame hashing, the unwind against fake memory, module ranges.

use super::*;

#[test]
fn hash_separates_order_and_length() {
    let a = hash_frames(&[1, 2, 3, 4, 5]);
    assert_ne!(a, hash_frames(&[2, 1, 3, 4, 5]));
    assert_ne!(a, hash_frames(&[1, 2, 3, 4]));
    assert_ne!(hash_frames(&[0]), hash_frames(&[0, 0]));
    assert_eq!(a, hash_frames(&[1, 2, 3, 4, 5]));
}

/// A fake stack image: 8-byte words by address; anything else is unreadable.
fn fake_read(mem: &std::collections::HashMap<u64, u64>) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
    |addr| mem.get(&addr).copied().ok_or(())
}

fn empty_snapshot(own: (u64, u64)) -> Snapshot {
    Snapshot {
        unwinder: NativeUnwinder::new(),
        active: Vec::new(),
        known: Vec::new(),
        counts: LoadCounts::default(),
        own,
    }
}

fn verified() -> Box<Verified> {
    Verified::empty(0, 0)
}

/// Code without unwind tables is unwound through its frame pointers: [bp] holds the
/// caller's bp, [bp + 8] the return address.
#[test]
fn unwinds_a_fake_frame_pointer_chain_and_skips_our_own_frames() {
    let own = (0x1000, 0x2000);
    let (sp, bp0, bp1, bp2) = (0x7000_0000u64, 0x7000_0100, 0x7000_0200, 0x7000_0300);
    let mem: std::collections::HashMap<u64, u64> = [
        (bp0, bp1),
        (bp0 + 8, 0x1800), // back into oomtrace (the hook's frame)
        (bp1, bp2),
        (bp1 + 8, 0x40_1000), // the caller
        (bp2, 0),
        (bp2 + 8, 0x40_2000), // its caller; bp 0 ends the chain
    ]
    .into_iter()
    .collect();
    let snap = empty_snapshot(own);
    let mut cache = NativeCache::new();
    let mut v = verified();
    let n = unwind_with(
        &snap,
        &mut cache,
        (0x1500, sp, bp0),
        (64, (0, 0)),
        &mut v,
        fake_read(&mem),
    );
    assert!(n >= 4, "{:x?}", &v.raw[..n]);
    assert_eq!(&v.raw[..4], &[0x1500, 0x1800, 0x40_1000, 0x40_2000]);
    assert_eq!(&v.slots[1..4], &[bp0 + 8, bp1 + 8, bp2 + 8]);
    assert_eq!(&caller_frames(&v, own, 64)[..2], &[0x40_1000, 0x40_2000]);
    // The depth counts the caller's frames only.
    let n = unwind_with(
        &snap,
        &mut cache,
        (0x1500, sp, bp0),
        (1, (0, 0)),
        &mut v,
        fake_read(&mem),
    );
    assert_eq!(&v.raw[..n], &[0x1500, 0x1800, 0x40_1000]);
    assert_eq!(caller_frames(&v, own, 1), &[0x40_1000]);
}

/// In a Python program the unwind ends before the first caller frame in the interpreter
/// (the Python frames take over there), but never before the first caller frame.
#[test]
fn the_unwind_ends_at_the_interpreter() {
    let own = (0x1000, 0x2000);
    let interpreter = (0x50_0000, 0x60_0000);
    let (sp, bp0, bp1, bp2, bp3) = (
        0x7000_0000u64,
        0x7000_0100,
        0x7000_0200,
        0x7000_0300,
        0x7000_0400,
    );
    let mem: std::collections::HashMap<u64, u64> = [
        (bp0, bp1),
        (bp0 + 8, 0x1800), // the hook's frame
        (bp1, bp2),
        (bp1 + 8, 0x40_1000), // an extension
        (bp2, bp3),
        (bp2 + 8, 0x50_1000), // the interpreter
        (bp3, 0),
        (bp3 + 8, 0x50_2000), // the interpreter again (its main)
    ]
    .into_iter()
    .collect();
    let snap = empty_snapshot(own);
    let mut cache = NativeCache::new();
    let mut v = verified();
    let n = unwind_with(
        &snap,
        &mut cache,
        (0x1500, sp, bp0),
        (64, interpreter),
        &mut v,
        fake_read(&mem),
    );
    assert_eq!(&v.raw[..n], &[0x1500, 0x1800, 0x40_1000]);
    // Called straight from the interpreter: its first frame is kept.
    let direct: std::collections::HashMap<u64, u64> = [
        (bp0, bp2),
        (bp0 + 8, 0x1800),
        (bp2, bp3),
        (bp2 + 8, 0x50_1000),
        (bp3, 0),
        (bp3 + 8, 0x50_2000),
    ]
    .into_iter()
    .collect();
    let n = unwind_with(
        &snap,
        &mut cache,
        (0x1500, sp, bp0),
        (64, interpreter),
        &mut v,
        fake_read(&direct),
    );
    assert_eq!(
        caller_frames(&v, own, 64),
        &[0x50_1000],
        "{:x?}",
        &v.raw[..n]
    );
}

#[test]
fn an_unreadable_or_looping_chain_stops_the_walk() {
    let (sp, bp0) = (0x7000_0000u64, 0x7000_0100);
    // [bp0] is missing: only the first frame.
    let mem: std::collections::HashMap<u64, u64> = [(bp0 + 8, 0x40_1000)].into_iter().collect();
    let snap = empty_snapshot((0, 0));
    let mut cache = NativeCache::new();
    let mut v = verified();
    let n = unwind_with(
        &snap,
        &mut cache,
        (0x40_0500, sp, bp0),
        (64, (0, 0)),
        &mut v,
        fake_read(&mem),
    );
    assert!(n <= 2, "{:x?}", &v.raw[..n]);
    // A frame that points back at itself: the stack must move up, so it ends.
    let looping: std::collections::HashMap<u64, u64> =
        [(bp0, bp0), (bp0 + 8, 0x40_1000)].into_iter().collect();
    let n = unwind_with(
        &snap,
        &mut cache,
        (0x40_0500, sp, bp0),
        (64, (0, 0)),
        &mut v,
        fake_read(&looping),
    );
    assert!(n < 8, "{:x?}", &v.raw[..n]);
}

#[test]
fn ranges_lookup() {
    let r = [(10, 20), (30, 40)];
    assert!(in_ranges(&r, 10) && in_ranges(&r, 19) && in_ranges(&r, 35));
    assert!(!in_ranges(&r, 9) && !in_ranges(&r, 20) && !in_ranges(&r, 45));
}

/// Two remembered stacks from one (sp, bp) that differ in one return address: each is found
/// while its addresses are in place, the entry that followed the last hit is tried first (a
/// path after itself, two paths in turn), and another bp finds neither.
#[test]
fn a_verified_hit_tries_the_entry_that_followed_the_last_hit_first() {
    let mut ts = ThreadStacks::with(1, (0, Arc::new(empty_snapshot((0, 0)))), 0);
    // The "stack": words of this test's own frame, above its stack pointer.
    let mut words = [0u64, 11, 12, 99];
    let base = words.as_mut_ptr();
    let sp = base as u64;
    let slots = |k: usize| sp + 8 * k as u64;
    let entry = |third: u64, id: u32| {
        let mut v = verified();
        v.sp = sp;
        v.n = 4;
        v.raw[..4].copy_from_slice(&[0, 11, 12, third]);
        v.slots[..4].copy_from_slice(&[0, slots(1), slots(2), slots(3)]);
        v.id = id;
        *v
    };
    ts.remember(entry(13, 1));
    ts.remember(entry(99, 2));
    assert_eq!(
        ts.verified.iter().filter(|v| v.id != 0).count(),
        2,
        "both slots lie in this thread's stack"
    );
    assert_eq!(ts.last_hit, 1, "the entry just remembered");
    assert_eq!(ts.verified_hit(sp, 0), Some(2));
    assert_eq!((ts.last_hit, ts.follows[1]), (1, 1));
    // The other path's address back in place, then the two in turn.
    let set = |ra: u64| {
        // SAFETY: the last word of this frame's own array, through the pointer the entries'
        // slots were made from.
        unsafe { base.add(3).write_volatile(ra) }
    };
    set(13);
    assert_eq!(ts.verified_hit(sp, 0), Some(1));
    assert_eq!((ts.last_hit, ts.follows[1]), (0, 0));
    set(99);
    assert_eq!(ts.verified_hit(sp, 0), Some(2));
    set(13);
    assert_eq!(ts.verified_hit(sp, 0), Some(1));
    assert_eq!(ts.follows[..2], [1, 0], "each path's successor learnt");
    assert_eq!(ts.verified_hit(sp, 8), None, "another bp");
    std::hint::black_box(&words);
}

/// A remembered stack longer than one group of four slots (the last group padded): a hit
/// while every address is in place, a miss when the last one, alone in its group, changes.
#[test]
fn a_verified_hit_reads_every_slot_of_a_padded_last_group() {
    let mut ts = ThreadStacks::with(1, (0, Arc::new(empty_snapshot((0, 0)))), 0);
    let mut words = [0u64, 11, 12, 13, 14, 15, 16];
    let base = words.as_mut_ptr();
    let sp = base as u64;
    let mut v = verified();
    v.sp = sp;
    v.n = words.len();
    v.raw[..v.n].copy_from_slice(&words);
    for k in 1..v.n {
        v.slots[k] = sp + 8 * k as u64;
    }
    v.id = 7;
    ts.remember(*v);
    assert_eq!(ts.verified_hit(sp, 0), Some(7));
    // SAFETY: the last word of this frame's own array, through the pointer the entry's slots
    // were made from.
    unsafe { base.add(6).write_volatile(99) };
    assert_eq!(ts.verified_hit(sp, 0), None, "the last slot changed");
    // SAFETY: as above.
    unsafe { base.add(6).write_volatile(16) };
    assert_eq!(ts.verified_hit(sp, 0), Some(7));
    std::hint::black_box(&words);
}
