//! A model of one device's CUDA caching allocator (torch 2.15's `DeviceCachingAllocator` in
//! `c10/cuda/CUDACachingAllocator.cpp`), fed tensor requests and frees, keeping what torch
//! keeps: segments, the blocks they are split into, the free blocks of each pool and stream,
//! and the reserve (`memory_reserved`) and allocated bytes (`memory_allocated`) with their peaks.
//!
//! What it does, as torch does it:
//! - a request is rounded ([`AllocConf`]: 512 bytes, or the next power-of-two division with
//!   `roundup_power2_divisions`); up to 1 MiB goes to the small pool, larger to the large pool;
//! - best fit: the smallest free block of the same pool and stream that is large enough;
//!   never an oversize block (`>= max_split_size`) for a request below `max_split_size`, and
//!   for a larger request only one less than `max_non_split_rounding` (20 MiB) above it;
//! - a new segment when none fits: 2 MiB for the small pool, `large_segment_size` (20 MiB)
//!   for requests under 10 MiB, else the request rounded up to 2 MiB; with
//!   `expandable_segments`, one growable segment per pool and stream instead, mapped in pages of
//!   2 MiB (small) or `large_segment_size` (large), its mapped pages counting as the reserve;
//! - the remainder of a block is split off when torch splits it (small pool or expandable:
//!   512 bytes left; large pool: the request is under `max_split_size` and more than 1 MiB is
//!   left), and a freed block merges with free neighbours of its segment;
//! - when the device has no room for a new segment: free cached oversize blocks until the
//!   request fits, retry; free every unsplit cached segment (and the unused pages of expandable
//!   ones), retry; then out of memory;
//! - `garbage_collection_threshold` with a memory fraction: before a new segment, once the
//!   reserve passes the threshold of the allowed memory, free unsplit cached large blocks
//!   older (in pool searches) than the average, until under it.
//!
//! "The device has no room" is `reserved + new segment > limit`, where the caller sets the
//! limit ([`Allocator::set_limit`]) to the memory the driver would give (the device total less
//! what else holds memory). Addresses are the model's own: blocks are ordered by them only to
//! break ties between free blocks of one size, as torch's sets do.
//!
//! Memory: O(blocks), which is O(live tensors + free blocks); nothing grows with events.
//! Time: O(log blocks) a request or free, amortized. Emptying the cache on an OOM visits only
//! the free blocks it can give back (each once, as it goes), never every stream's split
//! remainders: a program with a tensor on each of N streams would otherwise pay N for every
//! request once the device is full (issue 41: 80,000 streams took 25 s, a million never ended).
//!
//! Arithmetic is checked: a rounded request, a segment or a reserve past 2^64 - 1 bytes does
//! not exist on any device, so the driver would refuse it, and so does the model, instead of
//! saturating (or wrapping) into a peak no device holds. With no limit known that refusal is
//! the 64-bit bound's, not the device's, and [`OutOfMemory::past_64_bits`] says so.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::conf::AllocConf;

/// Every size is rounded up to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK: u64 = 512;
/// The largest request of the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// The segments of the small pool (`kSmallBuffer`) and its expandable page.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests below this use a `large_segment_size` segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger segments are rounded up to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;

/// The size torch allocates for a request of `size` bytes (`round_size`); None when that
/// passes 2^64 - 1 bytes.
pub fn round_size(conf: &AllocConf, size: u64) -> Option<u64> {
    if size < MIN_BLOCK {
        return Some(MIN_BLOCK);
    }
    let divisions = conf.divisions_for(size);
    // Saturating is exact here: no size is above a product past 2^64 - 1.
    if divisions > 1 && size > MIN_BLOCK.saturating_mul(divisions) {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK).checked_mul(MIN_BLOCK)
    }
}

/// `size` rounded up to the next of `divisions` equal steps between the powers of two around
/// it (1200 with 4 divisions: 1280); None past 2^64 - 1.
fn roundup_power2_next_division(size: u64, divisions: u64) -> Option<u64> {
    if size.is_power_of_two() {
        return Some(size);
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.checked_mul(2);
    }
    let below = size & !(step - 1);
    if below == size {
        Some(size)
    } else {
        below.checked_add(step)
    }
}

/// The segment torch asks the driver for to serve a rounded request (`get_allocation_size`);
/// None when that passes 2^64 - 1 bytes.
pub fn allocation_size(conf: &AllocConf, size: u64) -> Option<u64> {
    if size <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if size < MIN_LARGE_ALLOC {
        Some(conf.large_segment_size)
    } else {
        size.div_ceil(ROUND_LARGE).checked_mul(ROUND_LARGE)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolKind {
    Small,
    Large,
}

type Id = u32;

#[derive(Clone, Debug)]
struct Block {
    addr: u64,
    size: u64,
    stream: u64,
    pool: PoolKind,
    allocated: bool,
    /// Backed by memory (always, outside expandable segments).
    mapped: bool,
    prev: Option<Id>,
    next: Option<Id>,
    /// The expandable segment it lies in.
    expandable: Option<u32>,
    /// The pool's search count when it was cached (garbage collection's age).
    gc_base: u64,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// The cached blocks of one pool, all streams: free mapped blocks ordered as torch's
/// `BlockComparatorSize` (stream, size, address), unmapped ones as `BlockComparatorAddress`.
#[derive(Default)]
struct Pool {
    free: BTreeSet<(u64, u64, u64, Id)>,
    /// The free blocks emptying the cache gives back something of ([`Allocator::releasable`]),
    /// in `free`'s order. Torch walks all of `free` for them; the rest (split remainders, the
    /// bits of expandable pages) it passes over without a change, so visiting only these
    /// gives the same result without the walk, which grows with the streams (one remainder
    /// each).
    releasable: BTreeSet<(u64, u64, u64, Id)>,
    unmapped: BTreeSet<(u64, u64, Id)>,
    /// `get_free_blocks_call_count`: searches of this pool while garbage collection is on.
    searches: u64,
}

/// An expandable segment: address space for the whole device, mapped page by page.
#[derive(Clone, Copy, Debug)]
struct Expandable {
    base: u64,
    page: u64,
}

/// A request the allocator refused: what it held then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The request, rounded (as asked when rounded it would pass 2^64 - 1 bytes).
    pub size: u64,
    /// The segment it would have needed (None: past 2^64 - 1 bytes).
    pub alloc_size: Option<u64>,
    /// The reserve and allocated bytes after the cache was emptied.
    pub reserved: u64,
    pub allocated: u64,
    /// Refused only because it would take the model past 2^64 - 1 bytes (of reserve, or of
    /// address space), with no device limit known that refuses it anyway: no device could
    /// serve it, but that is the model's bound speaking, which a prediction must say.
    pub past_64_bits: bool,
}

/// One device's caching allocator under one setting.
pub struct Allocator {
    conf: AllocConf,
    blocks: Vec<Option<Block>>,
    spare: Vec<Id>,
    pools: [Pool; 2],
    segments: Vec<Option<Expandable>>,
    /// Live tensors by the key the caller gave them.
    live: FxHashMap<u64, Id>,
    next_addr: u64,
    /// What the driver would still let the allocator hold in all (see the module comment).
    limit: u64,
    /// The device's total memory, for the memory fraction and the expandable address space.
    device_total: Option<u64>,
    /// The cap the program set itself (`torch.cuda.set_per_process_memory_fraction`), in
    /// bytes, as its out-of-memory said it: applies unless the setting names a fraction.
    program_cap: Option<u64>,
    reserved: u64,
    allocated: u64,
    peak_reserved: u64,
    peak_allocated: u64,
    /// The request being served met the 64-bit bound ([`OutOfMemory::past_64_bits`]).
    past_64_bits: bool,
    /// Free-set entries the cache-emptying paths visited: for tests to bound the work.
    #[cfg(test)]
    visited: u64,
}

impl Allocator {
    pub fn new(conf: AllocConf, device_total: Option<u64>) -> Allocator {
        Allocator {
            conf,
            blocks: Vec::new(),
            spare: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            segments: Vec::new(),
            live: FxHashMap::default(),
            next_addr: 1 << 40,
            limit: u64::MAX,
            device_total,
            program_cap: None,
            reserved: 0,
            allocated: 0,
            peak_reserved: 0,
            peak_allocated: 0,
            past_64_bits: false,
            #[cfg(test)]
            visited: 0,
        }
    }

    pub fn conf(&self) -> &AllocConf {
        &self.conf
    }

    /// Sets what the allocator may hold in all before the driver refuses it (`u64::MAX`: no
    /// limit known).
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    pub fn set_device_total(&mut self, total: u64) {
        self.device_total = Some(total);
    }

    /// The memory-fraction cap the program set itself, in bytes (`allowed_memory_maximum`):
    /// the setting's own `per_process_memory_fraction`, when it has one, is what is asked
    /// about and wins.
    pub fn set_program_cap(&mut self, allowed: u64) {
        self.program_cap = Some(allowed);
    }

    /// `torch.cuda.memory_reserved()`.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
    /// `torch.cuda.memory_allocated()`: the rounded sizes of the blocks in use.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }
    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }
    pub fn peak_allocated(&self) -> u64 {
        self.peak_allocated
    }
    /// Live tensors (for tests and bounds).
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// The memory-fraction cap, when set (`allowed_memory_maximum`): the setting's, else the
    /// program's own.
    fn allowed(&self) -> Option<u64> {
        match self.conf.per_process_memory_fraction {
            Some(f) => Some((f * self.device_total? as f64) as u64),
            None => self.program_cap,
        }
    }

    /// Nothing but the 64-bit bound refuses a request: no device limit, no memory fraction.
    fn no_limit_known(&self) -> bool {
        self.limit == u64::MAX && self.allowed().is_none()
    }

    fn gc_on(&self) -> bool {
        self.conf.garbage_collection_threshold > 0.0 && self.allowed().is_some()
    }

    fn b(&self, id: Id) -> &Block {
        self.blocks[id as usize].as_ref().expect("live block")
    }
    fn bm(&mut self, id: Id) -> &mut Block {
        self.blocks[id as usize].as_mut().expect("live block")
    }

    fn add(&mut self, b: Block) -> Id {
        match self.spare.pop() {
            Some(id) => {
                self.blocks[id as usize] = Some(b);
                id
            }
            None => {
                self.blocks.push(Some(b));
                (self.blocks.len() - 1) as Id
            }
        }
    }
    fn remove(&mut self, id: Id) {
        self.blocks[id as usize] = None;
        self.spare.push(id);
    }

    fn pool(&mut self, kind: PoolKind) -> &mut Pool {
        &mut self.pools[kind as usize]
    }

    /// Whether emptying the cache gives back something of free block `id`: a whole segment
    /// (unsplit), or whole pages inside an expandable one. Neither changes while the block is
    /// free and cached: its size, place and neighbours change only once it is taken out of
    /// the free set (to be handed out, merged, mapped or unmapped).
    fn releasable(&self, id: Id) -> bool {
        let b = self.b(id);
        match b.expandable {
            None => !b.is_split(),
            Some(_) => self.whole_pages(b).is_some(),
        }
    }

    /// The whole pages inside expandable block `b`, as (first page's address, bytes).
    fn whole_pages(&self, b: &Block) -> Option<(u64, u64)> {
        let seg = self.segments[b.expandable.expect("expandable") as usize].expect("segment");
        let first = (b.addr - seg.base).div_ceil(seg.page);
        let end = (b.addr + b.size - seg.base) / seg.page;
        (first < end).then(|| (seg.base + first * seg.page, (end - first) * seg.page))
    }

    fn insert_free(&mut self, id: Id) {
        let b = self.b(id);
        let (k, key) = (b.pool, (b.stream, b.size, b.addr, id));
        let searches = self.pools[k as usize].searches;
        self.bm(id).gc_base = searches;
        let releasable = self.releasable(id);
        let pool = self.pool(k);
        pool.free.insert(key);
        if releasable {
            pool.releasable.insert(key);
        }
    }
    fn remove_free(&mut self, id: Id) {
        let b = self.b(id);
        let (k, key) = (b.pool, (b.stream, b.size, b.addr, id));
        // Checked in tests: the two sets agree as long as `releasable` holds still.
        let releasable = cfg!(debug_assertions) && self.releasable(id);
        let pool = self.pool(k);
        pool.free.remove(&key);
        let was = pool.releasable.remove(&key);
        debug_assert_eq!(
            was, releasable,
            "block {id} became (un)releasable while cached"
        );
    }
    fn insert_unmapped(&mut self, id: Id) {
        let b = self.b(id);
        let (k, key) = (b.pool, (b.stream, b.addr, id));
        self.pool(k).unmapped.insert(key);
    }
    fn remove_unmapped(&mut self, id: Id) {
        let b = self.b(id);
        let (k, key) = (b.pool, (b.stream, b.addr, id));
        self.pool(k).unmapped.remove(&key);
    }

    /// Address space for a new segment of `size` bytes (2 MiB apart, as the driver's are);
    /// None when the model's 64-bit address space has no room left for it: expandable
    /// segments of a device reported near 2^64 bytes, or millions of them (each takes 1 1/8
    /// of the device, 1 TiB when it is unknown).
    fn new_address(&mut self, size: u64) -> Option<u64> {
        let a = self.next_addr;
        let next = size
            .div_ceil(ROUND_LARGE)
            .checked_add(1)
            .and_then(|pages| pages.checked_mul(ROUND_LARGE))
            .and_then(|span| a.checked_add(span));
        let Some(next) = next else {
            // A limit of the model, never of the device: always said.
            self.past_64_bits = true;
            return None;
        };
        self.next_addr = next;
        Some(a)
    }

    /// The reserve with `n` bytes more, if the driver would give them: None past the limit,
    /// and past 2^64 - 1 bytes (noted when no limit is known that refuses it anyway).
    fn reserve_with(&mut self, n: u64) -> Option<u64> {
        let Some(after) = self.reserved.checked_add(n) else {
            self.past_64_bits |= self.no_limit_known();
            return None;
        };
        (after <= self.limit).then_some(after)
    }

    /// Only after [`Allocator::reserve_with`] said yes: the reserve stays within 64 bits,
    /// and so does `allocated`, which is part of it.
    fn grow_reserved(&mut self, n: u64) {
        self.reserved += n;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    /// A tensor of `request` bytes on `stream`, known by `key` until [`Allocator::free`].
    /// A key still live is freed first (its free was not seen).
    pub fn malloc(&mut self, key: u64, request: u64, stream: u64) -> Result<(), OutOfMemory> {
        if self.live.contains_key(&key) {
            self.free(key);
        }
        self.past_64_bits = false;
        let Some(size) = round_size(&self.conf, request) else {
            return Err(self.unservable(PoolKind::Large, request));
        };
        let kind = if size <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let Some(alloc_size) = allocation_size(&self.conf, size) else {
            return Err(self.unservable(kind, size));
        };
        let mut found = self.get_free_block(kind, stream, size);
        if found.is_none() {
            if self.gc_on() {
                self.garbage_collect();
            }
            found = self.alloc_block(kind, stream, size, alloc_size);
            if found.is_none() && self.release_available_cached_blocks(kind, stream, size) {
                found = self.alloc_block(kind, stream, size, alloc_size);
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.alloc_block(kind, stream, size, alloc_size);
            }
        }
        let Some(id) = found else {
            return Err(OutOfMemory {
                size,
                alloc_size: Some(alloc_size),
                reserved: self.reserved,
                allocated: self.allocated,
                past_64_bits: self.past_64_bits,
            });
        };
        let split = self.should_split(id, size);
        let id = self.alloc_found_block(id, size, split);
        self.live.insert(key, id);
        Ok(())
    }

    /// A request whose rounded size or segment passes 2^64 - 1 bytes: no cached block is
    /// that large (segments are within 64 bits) and no segment can be made, so it goes the
    /// way of every refused request: its pool searched (garbage collection counts searches),
    /// the cache emptied, refused. Under a known limit that is simply a request above it.
    fn unservable(&mut self, kind: PoolKind, size: u64) -> OutOfMemory {
        if self.gc_on() {
            self.pool(kind).searches += 1;
        }
        self.release_cached_blocks();
        OutOfMemory {
            size,
            alloc_size: None,
            reserved: self.reserved,
            allocated: self.allocated,
            past_64_bits: self.no_limit_known(),
        }
    }

    /// The tensor known by `key` is freed (PyTorch's `FREE_COMPLETED`); false if unknown.
    pub fn free(&mut self, key: u64) -> bool {
        let Some(id) = self.live.remove(&key) else {
            return false;
        };
        let size = self.b(id).size;
        self.bm(id).allocated = false;
        self.allocated -= size;
        for other in [self.b(id).prev, self.b(id).next] {
            self.try_merge(id, other);
        }
        self.insert_free(id);
        true
    }

    /// Best fit (`get_free_block`).
    fn get_free_block(&mut self, kind: PoolKind, stream: u64, size: u64) -> Option<Id> {
        if self.gc_on() {
            self.pool(kind).searches += 1;
        }
        let expandable_on = self.conf.expandable_segments;
        let pool = &self.pools[kind as usize];
        let mut candidates = pool
            .free
            .range((stream, size, 0, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| k.3);
        let mut id = candidates.next()?;
        if self.b(id).expandable.is_some() {
            if expandable_on {
                // A block at the end of an expandable segment counts as the size it can grow
                // to: a larger block that cannot grow may fit better.
                let grows_to = |a: &Allocator, id: Id| {
                    let b = a.b(id);
                    b.size
                        + b.next
                            .map_or(0, |n| if a.b(n).mapped { 0 } else { a.b(n).size })
                };
                for next in candidates {
                    if self.b(id).expandable.is_none() || grows_to(self, next) >= grows_to(self, id)
                    {
                        break;
                    }
                    id = next;
                }
            } else {
                id = candidates.find(|&n| self.b(n).expandable.is_none())?;
            }
        }
        let (block_size, max_split) = (self.b(id).size, self.conf.max_split_size);
        if size < max_split && block_size >= max_split {
            return None;
        }
        if size >= max_split && block_size >= size.saturating_add(self.conf.max_non_split_rounding)
        {
            return None;
        }
        self.remove_free(id);
        Some(id)
    }

    fn should_split(&self, id: Id, size: u64) -> bool {
        let b = self.b(id);
        let remaining = b.size - size;
        if b.pool == PoolKind::Small || self.conf.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.conf.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Hands out block `id` (not in any free set), splitting off what is left.
    fn alloc_found_block(&mut self, id: Id, size: u64, split: bool) -> Id {
        let block = if split {
            let rest = self.b(id).clone();
            let new = self.add(Block {
                addr: rest.addr,
                size,
                next: Some(id),
                allocated: false,
                gc_base: 0,
                ..rest
            });
            if let Some(p) = rest.prev {
                self.bm(p).next = Some(new);
            }
            let r = self.bm(id);
            r.prev = Some(new);
            r.addr += size;
            r.size -= size;
            self.insert_free(id);
            new
        } else {
            id
        };
        self.bm(block).allocated = true;
        let size = self.b(block).size;
        self.allocated += size;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        block
    }

    /// Merges free `src` into `dst` (neither in a set; `src` is taken out of its own).
    fn try_merge(&mut self, dst: Id, src: Option<Id>) -> u64 {
        let Some(src) = src else { return 0 };
        let s = self.b(src).clone();
        if s.allocated || s.mapped != self.b(dst).mapped {
            return 0;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        if self.b(dst).prev == Some(src) {
            let d = self.bm(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            if let Some(p) = s.prev {
                self.bm(p).next = Some(dst);
            }
        } else {
            self.bm(dst).next = s.next;
            if let Some(n) = s.next {
                self.bm(n).prev = Some(dst);
            }
        }
        self.bm(dst).size += s.size;
        self.remove(src);
        s.size
    }

    /// A new segment, or pages of an expandable one (`alloc_block`); None when the driver
    /// (or the memory fraction) refuses.
    fn alloc_block(
        &mut self,
        kind: PoolKind,
        stream: u64,
        size: u64,
        alloc_size: u64,
    ) -> Option<Id> {
        if let Some(allowed) = self.allowed() {
            // Past 2^64 - 1 it is past the fraction too: an ordinary refusal.
            if self
                .reserved
                .checked_add(alloc_size)
                .is_none_or(|r| r > allowed)
            {
                return None;
            }
        }
        if self.conf.expandable_segments {
            return self.try_allocate_expandable_block(kind, stream, size);
        }
        self.reserve_with(alloc_size)?;
        let addr = self.new_address(alloc_size)?;
        self.grow_reserved(alloc_size);
        Some(self.add(Block {
            addr,
            size: alloc_size,
            stream,
            pool: kind,
            allocated: false,
            mapped: true,
            prev: None,
            next: None,
            expandable: None,
            gc_base: 0,
        }))
    }

    fn try_allocate_expandable_block(
        &mut self,
        kind: PoolKind,
        stream: u64,
        size: u64,
    ) -> Option<Id> {
        let mut c = self.find_expandable_block(kind, stream, size)?;
        if !self.b(c).mapped {
            let n = self.b(c).size.min(size);
            if !self.map_block(c, n) {
                return None;
            }
        }
        while self.b(c).size < size {
            let remaining = size - self.b(c).size;
            // Room was found after it, unless the request is larger than a whole segment's
            // address space (1 1/8 of the device): more than the device, refused.
            let next = self.b(c).next?;
            let n = remaining.min(self.b(next).size);
            if !self.map_block(next, n) {
                return None;
            }
            c = next;
        }
        self.remove_free(c);
        Some(c)
    }

    /// The lowest place in a segment of this pool and stream with room for `size` (free and
    /// unmapped blocks in a row), or a new segment (None: no address space left for one).
    fn find_expandable_block(&mut self, kind: PoolKind, stream: u64, size: u64) -> Option<Id> {
        let free_now = |a: &Allocator, id: Option<Id>| id.filter(|&i| !a.b(i).allocated);
        let starts: Vec<Id> = self.pools[kind as usize]
            .unmapped
            .range((stream, 0, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| k.2)
            .collect();
        for u in starts {
            let c = free_now(self, self.b(u).prev).unwrap_or(u);
            let (mut bytes, mut at) = (0u64, Some(c));
            while bytes < size {
                let Some(i) = free_now(self, at) else { break };
                bytes += self.b(i).size;
                at = self.b(i).next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        let page = match kind {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => self.conf.large_segment_size,
        };
        // torch reserves address space for 1 1/8 of the device. When it is unknown, 1 TiB, or
        // the request if larger: nothing refuses a request before the device is known.
        let space = self
            .device_total
            .map_or((1 << 40).max(size), |t| t.saturating_add(t / 8));
        // Saturated, it is more than any address space: new_address refuses it.
        let span = space.div_ceil(page).max(1).saturating_mul(page);
        let base = self.new_address(span)?;
        self.segments.push(Some(Expandable { base, page }));
        let id = self.add(Block {
            addr: base,
            size: span,
            stream,
            pool: kind,
            allocated: false,
            mapped: false,
            prev: None,
            next: None,
            expandable: Some((self.segments.len() - 1) as u32),
            gc_base: 0,
        });
        self.insert_unmapped(id);
        Some(id)
    }

    /// Maps the pages under the first `size` bytes of unmapped block `id`; false when the
    /// driver has no room for them.
    fn map_block(&mut self, id: Id, size: u64) -> bool {
        let b = self.b(id).clone();
        let seg = self.segments[b.expandable.expect("expandable") as usize].expect("segment");
        let first = (b.addr - seg.base) / seg.page;
        let end = (b.addr + size - seg.base).div_ceil(seg.page);
        let mapped = (end - first) * seg.page;
        if mapped == 0 || self.reserve_with(mapped).is_none() {
            return false;
        }
        self.remove_unmapped(id);
        self.bm(id).mapped = true;
        if mapped < b.size {
            let rest = self.add(Block {
                addr: b.addr + mapped,
                size: b.size - mapped,
                mapped: false,
                prev: Some(id),
                allocated: false,
                ..b.clone()
            });
            if let Some(n) = b.next {
                self.bm(n).prev = Some(rest);
            }
            self.bm(id).next = Some(rest);
            self.bm(id).size = mapped;
            self.insert_unmapped(rest);
        }
        let (p, n) = (self.b(id).prev, self.b(id).next);
        self.try_merge(id, p);
        self.try_merge(id, n);
        self.insert_free(id);
        self.grow_reserved(mapped);
        true
    }

    /// Unmaps the whole pages inside free expandable block `id` (`unmap_block`).
    fn unmap_block(&mut self, id: Id) {
        let b = self.b(id).clone();
        let Some((start, len)) = self.whole_pages(&b) else {
            return;
        };
        self.remove_free(id);
        let before = start - b.addr;
        if before > 0 {
            let f = self.add(Block {
                size: before,
                prev: b.prev,
                next: Some(id),
                ..b.clone()
            });
            if let Some(p) = b.prev {
                self.bm(p).next = Some(f);
            }
            self.bm(id).prev = Some(f);
            self.insert_free(f);
        }
        let after = b.size - before - len;
        if after > 0 {
            let f = self.add(Block {
                addr: start + len,
                size: after,
                prev: Some(id),
                next: b.next,
                ..b.clone()
            });
            if let Some(n) = b.next {
                self.bm(n).prev = Some(f);
            }
            self.bm(id).next = Some(f);
            self.insert_free(f);
        }
        {
            let m = self.bm(id);
            m.addr = start;
            m.size = len;
            m.mapped = false;
        }
        let (p, n) = (self.b(id).prev, self.b(id).next);
        self.try_merge(id, p);
        self.try_merge(id, n);
        self.insert_unmapped(id);
        self.reserved -= len;
    }

    /// Gives a whole cached segment back to the driver (`release_block`).
    fn release_block(&mut self, id: Id) {
        self.remove_free(id);
        self.reserved -= self.b(id).size;
        self.remove(id);
    }

    /// Frees every unsplit cached segment of a pool and the unused pages of its expandable
    /// segments (`release_blocks`).
    fn release_blocks(&mut self, kind: PoolKind) {
        // Torch walks every cached block; those it would pass over (split remainders, pieces
        // of expandable pages) are not in `releasable`, in the same order otherwise.
        let cached: Vec<Id> = self.pools[kind as usize]
            .releasable
            .iter()
            .map(|k| k.3)
            .collect();
        #[cfg(test)]
        {
            self.visited += cached.len() as u64;
        }
        let mut to_unmap = Vec::new();
        for id in cached {
            let b = self.b(id);
            if b.expandable.is_some() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id);
            }
        }
        for id in to_unmap {
            self.unmap_block(id);
            let b = self.b(id);
            if !b.is_split() && !b.mapped {
                let seg = b.expandable.expect("expandable") as usize;
                self.remove_unmapped(id);
                self.remove(id);
                self.segments[seg] = None;
            }
        }
    }

    /// `release_cached_blocks` (the default pool: no graphs).
    fn release_cached_blocks(&mut self) {
        self.release_blocks(PoolKind::Large);
        self.release_blocks(PoolKind::Small);
    }

    /// Frees cached oversize blocks of this pool and stream, one large enough or the largest
    /// ones until enough (`release_available_cached_blocks`); false when that is not enough.
    fn release_available_cached_blocks(&mut self, kind: PoolKind, stream: u64, size: u64) -> bool {
        let max_split = self.conf.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let want = size.max(max_split);
        let pool = &self.pools[kind as usize];
        let at = pool.free.range((stream, want, 0, 0)..).next().copied();
        if let Some((s, _, _, id)) = at {
            let b = self.b(id);
            if s == stream && b.expandable.is_none() {
                // A block this large is a whole segment: torch never splits oversize blocks.
                if b.is_split() {
                    return false;
                }
                self.release_block(id);
                return true;
            }
        }
        let mut chosen = Vec::new();
        let mut released = 0u64;
        for &(s, bsize, _, id) in pool.free.range(..(stream, want, 0, 0)).rev() {
            if released >= want || bsize < max_split || s != stream {
                break;
            }
            let b = self.b(id);
            if b.expandable.is_none() && !b.is_split() {
                released += bsize;
                chosen.push(id);
            }
        }
        for id in chosen {
            self.release_block(id);
        }
        released >= want
    }

    /// `garbage_collect_cached_blocks`: frees unsplit cached large blocks, oldest first by
    /// rounds, until the reserve is under the threshold of the allowed memory.
    fn garbage_collect(&mut self) {
        let Some(allowed) = self.allowed() else {
            return;
        };
        let threshold = (self.conf.garbage_collection_threshold * allowed as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let searches = self.pools[PoolKind::Large as usize].searches;
        let age = |a: &Allocator, id: Id| searches.saturating_sub(a.b(id).gc_base);
        // Torch looks at the unsplit blocks among all cached ones: all of them are releasable
        // (whole segments; an unsplit expandable one is its whole segment, pages and all).
        let (mut total_age, mut count) = (0u64, 0u64);
        for k in &self.pools[PoolKind::Large as usize].releasable {
            if !self.b(k.3).is_split() {
                total_age += age(self, k.3);
                count += 1;
            }
        }
        #[cfg(test)]
        {
            self.visited += self.pools[PoolKind::Large as usize].releasable.len() as u64;
        }
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            let cached: Vec<Id> = self.pools[PoolKind::Large as usize]
                .releasable
                .iter()
                .map(|k| k.3)
                .collect();
            #[cfg(test)]
            {
                self.visited += cached.len() as u64;
            }
            for id in cached {
                let b = self.b(id);
                if !b.is_split() && b.expandable.is_none() && age(self, id) as f64 >= threshold_age
                {
                    freed = true;
                    reclaimed += b.size;
                    total_age -= age(self, id);
                    count -= 1;
                    self.release_block(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
